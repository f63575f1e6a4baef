"""Physics tests of the differentiable engine (issue 2, section 5)."""
from __future__ import annotations

import copy
import dataclasses
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

from tensegrity_engine.physics import collision
from tensegrity_engine.physics.actuators import actuator_update
from tensegrity_engine.groundtruth import environments
from tensegrity_engine.physics.config import CONFIG_DIR, ConfigError, load_robot, robot_from_dict
from tensegrity_engine.physics.params import PARAM_SPECS, PhysicalParameters
from tensegrity_engine.physics.engine import TensegrityEngine
from tensegrity_engine.physics.state import POS, center_of_mass, initial_rod_state, quat_axis

from robot_builders import two_rod_robot

torch.set_num_threads(2)


def _perturbed(state: torch.Tensor, seed: int, scale: float = 0.3) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    state = state.clone()
    state[..., 7:13] += scale * torch.randn(state[..., 7:13].shape, generator=g, dtype=state.dtype)
    return state


# ----------------------------------------------------------------------------- gradients
@pytest.mark.parametrize("integrator", ["semi_implicit", "implicit", "rk4"])
@pytest.mark.parametrize("case", ["no_contact", "ground", "rod_rod"])
def test_gradcheck_one_step(case, integrator):
    """d(next state)/d(state, every parameter) matches finite differences in float64."""
    if case == "rod_rod":
        robot = two_rod_robot(gap=0.095)      # capsules overlap by 5 mm
        engine = TensegrityEngine(robot, floor=False)
    else:
        robot = two_rod_robot(gap=0.3)
        engine = TensegrityEngine(robot, floor=(case == "ground"))
    state = torch.tensor(initial_rod_state(robot))
    if case == "ground":
        state[:, 2] -= 0.6 - 0.045                     # rod 0's end spheres 5 mm into the floor
    state = _perturbed(state, seed=1, scale=0.2)
    act = torch.tensor([0.55, 0.5], dtype=torch.float64)
    command = torch.tensor([0.45, 0.62], dtype=torch.float64)
    names = list(engine.param_values(torch.float64, "cpu"))
    base = {k: v.detach().clone() for k, v in engine.param_values(torch.float64, "cpu").items()}

    def one_step(state_in, *values):
        p = dict(zip(names, values))
        nxt, act_next = engine.step(state_in, act, command, 2e-3, integrator=integrator, params=p)
        return nxt, act_next

    inputs = (state.requires_grad_(True), *[base[n].requires_grad_(True) for n in names])
    # Sanity: the case really has the contact it claims (else the test proves nothing).
    out = engine.forces(state.detach(), engine.rest_lengths(act, base), base, jacobians=True)
    if case == "ground":
        nodes = engine.end_nodes(state.detach())
        assert (nodes[..., 2] < torch.tensor(robot.rod_radius)[:, None]).any()
    if case == "rod_rod":
        nodes = engine.end_nodes(state.detach())
        c = collision.rod_rod_contacts(nodes, torch.tensor(robot.rod_radius), torch.tensor([0]), torch.tensor([1]))
        assert (c.depth > 0).all()
    assert torch.isfinite(out["K"]).all()
    assert torch.autograd.gradcheck(one_step, inputs, eps=1e-6, atol=1e-5, rtol=1e-4)


SOFT_ONLY = ("contact_time_constant", "contact_damping_ratio")


@pytest.mark.parametrize("law", ["penalty", "soft"])
def test_gradients_reach_every_raw_parameter_through_contacts(law):
    """Loss after a short contact-rich rollout has non-zero gradient for every parameter
    (with a winch speed limit that binds: one that cannot has rightly none); the soft
    contact law's own values reach it under that law only, and every friction value does
    under both."""
    import dataclasses

    robot = load_robot("superball")
    robot = robot.replace(contact=dataclasses.replace(robot.contact, law=law))
    params = PhysicalParameters(robot, values={"actuator_max_speed": 0.8})   # limited for 12 of 30 ms
    engine = TensegrityEngine(robot, params)
    state0, act0 = environments.rest_pose(robot)
    state = _perturbed(torch.tensor(state0).unsqueeze(0), seed=3, scale=1.0)
    state[..., 7] += 1.0                              # rolling push: sliding, spin and roll
    act = torch.tensor(act0).unsqueeze(0)
    commands = (act + 0.05).unsqueeze(-2).expand(1, 30, -1)
    states, _ = engine.rollout(state, act, commands, 1e-3)
    loss = (states[..., -1, :, :3] ** 2).sum() + (states[..., -1, :, 7:] ** 2).sum()
    loss.backward()
    for spec in PARAM_SPECS:
        if spec.name == "actuator_delay" or (law == "penalty" and spec.name in SOFT_ONLY):
            # timing of the commands: where they meet the data (objective, planner), not a step
            assert getattr(params, spec.name).grad is None
            continue
        if law == "soft" and spec.name in ("contact_stiffness", "contact_damping"):
            continue                          # rod-rod contacts only: none in this run
        grad = getattr(params, spec.name).grad
        assert grad is not None and torch.isfinite(grad).all(), spec.name
        assert grad.abs().max() > 0, f"no gradient reaches {spec.name}"


@pytest.mark.parametrize("gap", [0.004, 0.03, 0.3, -0.03, 0.0])
def test_rate_limited_actuator_is_the_exact_solution(gap):
    """The closed form over a 20 ms step against a 1e5-substep integration of
    act' = clip((u - act) / tau, -v, v): within the linear range (0.004), crossing into it
    mid-step (0.03), limited throughout (0.3), either sign; a limit that cannot bind is the
    plain filter."""
    tau, v, h = torch.tensor(0.05), torch.tensor(0.8), 0.02       # knee at tau v = 40 mm
    command = torch.tensor(0.5, dtype=torch.float64)
    act = command + gap
    end, mean = actuator_update(act, command, tau.double(), h, v.double())
    n = 100_000
    a, total = float(act), 0.0
    for _ in range(n):
        total += a
        a += h / n * float(np.clip((0.5 - a) / 0.05, -0.8, 0.8))
    assert float(end) == pytest.approx(a, abs=1e-7)
    assert float(mean) == pytest.approx(total / n, abs=1e-7)
    plain = actuator_update(act, command, tau.double(), h)
    unbound = actuator_update(act, command, tau.double(), h, torch.tensor(1e3, dtype=torch.float64))
    for x, y in zip(plain, unbound):
        assert float(x) == pytest.approx(float(y), abs=1e-15)
    if abs(gap) > 0.04:
        assert abs(float(end) - float(plain[0])) > 1e-3                # the limit binds


# ----------------------------------------------------------------------------- accuracy
def _noncontact_episode(robot, seed, steps):
    rng = np.random.default_rng(seed)
    return environments.sample_noncontact_episode(robot, rng, steps)


def _run(engine, episode, dt, integrator="semi_implicit", dtype=torch.float64):
    s0, a0, cmds, wr = (torch.as_tensor(x, dtype=dtype) for x in episode)
    factor = int(round(1e-3 / dt))
    with torch.no_grad():
        states, _ = engine.rollout(s0, a0, cmds.repeat_interleave(factor, -2), dt, integrator=integrator,
                                   wrenches=wr.repeat_interleave(factor, -3), record_every=factor)
    return states


def test_dt_invariance_first_order_convergence():
    """Non-contact rollouts at 1, 0.5 and 0.25 ms agree, and converge at first order.

    Tolerance: semi-implicit Euler with start-of-step actuation is first-order, so the
    1 ms vs 0.5 ms gap must be about twice the 0.5 vs 0.25 ms gap, and small in absolute
    terms (1 mm over 0.5 s of random commands and forces moving nodes by ~0.2 m).
    """
    robot = load_robot("superball")
    engine = TensegrityEngine(robot, fixed_rods=(0,), floor=False)
    episode = _noncontact_episode(robot, seed=4, steps=500)
    x1, x05, x025 = (_run(engine, episode, dt)[..., POS] for dt in (1e-3, 5e-4, 2.5e-4))
    gap_coarse = (x1 - x05).abs().max().item()
    gap_fine = (x05 - x025).abs().max().item()
    travel = (x1[-1] - x1[0]).abs().max().item()
    assert travel > 0.02, "episode too quiet to test anything"
    assert gap_coarse < 1e-3
    assert 1.5 < gap_coarse / gap_fine < 2.6


def test_energy_semi_implicit_conserves_implicit_dissipates():
    """No damping, friction or contact: semi-implicit conserves energy to first order in dt.

    Measured here (SUPERball in free fall, 0.5 rad/s random spins, pre-tensioned cables):
    semi-implicit loses 0.7 % of the total energy over 5 s at 1 ms, half that at 0.5 ms
    (explicit rotation updates are not symplectic; MuJoCo's Euler does exactly the same),
    while linearised backward Euler loses 2.3 times as much (33.6 J vs 14.6 J) and monotonically.
    """
    robot = load_robot("superball")
    engine = TensegrityEngine(robot, floor=False)
    p = {k: v.detach().clone() for k, v in engine.param_values(torch.float64, "cpu").items()}
    for name in ("cable_damping", "contact_damping", "friction_sliding", "friction_torsional", "friction_rolling"):
        p[name] = torch.zeros_like(p[name])
    state = _perturbed(torch.tensor(initial_rod_state(robot)), seed=5, scale=0.5)
    act = engine.initial_act(state) - 0.05            # pre-tension: cables taut and vibrating

    def energy_drift(dt, seconds, integrator="semi_implicit"):
        steps = int(round(seconds / dt))
        with torch.no_grad():
            states, acts = engine.rollout(state, act, act.expand(steps, -1), dt, integrator=integrator,
                                          params=p, record_every=steps // 10)
            return torch.stack([engine.energy(s, a, p) for s, a in zip(states, acts)]) - engine.energy(state, act, p)

    total = engine.energy(state, act, p).item()
    semi = energy_drift(1e-3, 5.0)
    assert semi.abs().max() < 0.01 * total
    coarse, fine = energy_drift(1e-3, 1.0)[-1], energy_drift(5e-4, 1.0)[-1]
    assert 1.6 < (coarse / fine).item() < 2.4            # vanishes at first order as dt -> 0
    implicit = energy_drift(1e-3, 5.0, "implicit")
    assert implicit[-1] < 2.0 * semi[-1] < 0              # dissipates more than twice as much
    assert (implicit[1:] <= implicit[:-1]).all()


def test_slack_cable_pulls_with_zero_force_and_taut_cable_obeys_hooke():
    robot = two_rod_robot(gap=0.3)
    engine = TensegrityEngine(robot, floor=False)
    state = torch.tensor(initial_rod_state(robot))
    p = engine.param_values(torch.float64, "cpu")
    nodes = engine.end_nodes(state)
    length = torch.linalg.vector_norm(nodes[1, 0] - nodes[0, 0]).item()
    slack = torch.tensor([length + 0.1, length + 0.2], dtype=torch.float64)
    assert torch.equal(engine.cable_tensions(state, slack, p), torch.zeros(2, dtype=torch.float64))
    taut = torch.tensor([length - 0.1, length - 0.1], dtype=torch.float64)
    tension = engine.cable_tensions(state, taut, p)
    assert torch.allclose(tension, torch.full((2,), 500.0 * 0.1, dtype=torch.float64))
    # While its ends move, a slack cable carries only the slack share s of its damping,
    # c s dl/dt (a tendon damper): by default s is 1e-3 of it, at s = 1 all of it, pushing
    # while the cable shortens.
    moving = state.clone()
    moving[1, 7:10] = torch.tensor([0.0, 0.0, -3.0])
    gap = nodes[1, 0] - nodes[0, 0]
    rate = (gap / length) @ moving[1, 7:10]                         # rod 0 rests, rod 1 translates
    assert abs(rate.item()) > 1.0                                  # the ends approach (sign -1: separate)
    for share in (1e-3, 1.0 - 1e-6):
        p_s = dict(p, cable_slack_damping=torch.full((1,), share, dtype=torch.float64))
        for sign in (1.0, -1.0):
            run = state.clone()
            run[1, 7:10] = sign * moving[1, 7:10]
            tension = engine.cable_tensions(run, slack + 0.5, p_s)
            assert torch.allclose(tension, sign * share * 5.0 * rate, rtol=1e-4, atol=0)


def test_batch_equals_single_runs():
    robot = load_robot("superball")
    engine = TensegrityEngine(robot)
    s0, a0 = environments.rest_pose(robot)
    states = torch.stack([_perturbed(torch.tensor(s0), seed=i) for i in range(4)])
    acts = torch.tensor(a0).expand(4, -1).clone()
    g = torch.Generator().manual_seed(0)
    commands = acts.unsqueeze(1) + 0.05 * torch.randn(4, 40, acts.shape[-1], generator=g, dtype=torch.float64)
    with torch.no_grad():
        batch, _ = engine.rollout(states, acts, commands, 1e-3)
        singles = torch.stack([engine.rollout(states[i], acts[i], commands[i], 1e-3)[0] for i in range(4)])
        nested, _ = engine.rollout(states.view(2, 2, 6, 13), acts.view(2, 2, -1),
                                   commands.view(2, 2, 40, -1), 1e-3)
    assert torch.allclose(batch, singles, atol=1e-12)
    assert torch.allclose(nested.reshape(batch.shape), batch, atol=1e-12)


def test_float32_matches_float64():
    robot = load_robot("superball")
    engine = TensegrityEngine(robot, fixed_rods=(0,), floor=False)
    episode = _noncontact_episode(robot, seed=8, steps=200)
    x64 = _run(engine, episode, 1e-3)
    x32 = _run(engine, episode, 1e-3, dtype=torch.float32)
    assert (x64[..., POS] - x32[..., POS].double()).abs().max() < 1e-3


# ----------------------------------------------------------------------------- vs MuJoCo
STRUCTURES = {
    "uniform": lambda r: r,
    "end_heavy": lambda r: r.replace(rod_inertia_factor=np.full(r.num_rods, 2.2)),
    "tendon_damped": lambda r: r.replace(cable_slack_damping=np.full(r.num_cables, 0.8)),
    "speed_limited": lambda r: r.replace(actuator=dataclasses.replace(r.actuator, max_speed=0.3)),
}


@pytest.mark.parametrize("structure", list(STRUCTURES))
def test_engine_matches_mujoco_without_contact(structure):
    """Same parameters, no contact: MuJoCo (Euler) and the engine take the same steps,
    for uniform rods, end-heavy rods (transverse inertia x2.2), cables whose damping
    mostly acts taut or slack (a tendon's, 80 %) and winches limited to 0.3 m/s.

    Measured here: CoM error after 1 s ~ 1e-15 m (round-off), path ~ 0.7 m.
    """
    base = load_robot("superball")
    robot = STRUCTURES[structure](base)
    m = torch.tensor(robot.rod_mass)
    s0, a0, cmds, wr = _noncontact_episode(robot, seed=0, steps=1000)
    cmds[500:] = robot.command_high          # cables let out: slack, where only a tendon damps
    episode = s0, a0, cmds, wr
    mj, _ = environments.noncontact_twin(robot).rollout(s0[None], a0[None], cmds[None], wr[None])
    engine = TensegrityEngine(robot, fixed_rods=(0,), floor=False)
    states = _run(engine, episode, 1e-3)
    com_engine = center_of_mass(states, m)
    com_mujoco = center_of_mass(torch.tensor(mj[0]), m)
    path = (com_mujoco[1:] - com_mujoco[:-1]).norm(dim=-1).sum()
    assert path > 0.1
    assert (com_engine[-1] - com_mujoco[-1]).norm() < 1e-9
    if structure != "uniform":      # the structure matters: the config's robot moves differently
        plain = _run(TensegrityEngine(base, fixed_rods=(0,), floor=False), episode, 1e-3)
        assert (center_of_mass(plain, m)[-1] - com_engine[-1]).norm() > 1e-3


def test_resting_height_matches_mujoco():
    """Engine started at MuJoCo's settled pose stays put within a few millimetres.

    Contact models differ (penalty vs soft constraints): measured here the engine's CoM
    settles 1.6 mm lower than MuJoCo's and does not move horizontally (< 1e-4 m in 2 s)
    thanks to velocity-implicit static friction (explicit smooth Coulomb friction made it
    random-walk at ~8 cm/s).
    """
    robot = load_robot("superball")
    m = torch.tensor(robot.rod_mass)
    s0, a0 = environments.rest_pose(robot)
    engine = TensegrityEngine(robot)
    state = torch.tensor(s0)
    act = torch.tensor(a0)
    with torch.no_grad():
        states, _ = engine.rollout(state, act, act.expand(2000, -1), 1e-3, record_every=100)
    com0 = center_of_mass(state, m)
    com = center_of_mass(states, m)
    assert abs(com[-1, 2] - com0[2]) < 5e-3
    assert (com[-1, :2] - com0[:2]).norm() < 5e-3
    assert states[-1, :, 7:].abs().max() < 0.05       # at rest


def test_implicit_is_stable_at_the_sampling_interval():
    """Implicit Euler at dt = T = 100 ms (progressive training's first stage) stays bounded,
    with the paper's penalty ground (under the soft law training skips these stages)."""
    robot = load_robot("superball")
    robot = robot.replace(contact=dataclasses.replace(robot.contact, law="penalty"))
    engine = TensegrityEngine(robot, actuator_timing="mean")
    s0, a0 = environments.rest_pose(robot)
    state = _perturbed(torch.tensor(s0), seed=2, scale=1.0)
    act = torch.tensor(a0)
    commands = (act + 0.1 * torch.sin(torch.arange(50.0, dtype=torch.float64))[:, None]).clamp(0.55, 1.05)
    with torch.no_grad():
        states, _ = engine.rollout(state, act, commands, 0.1, integrator="implicit")
        semi, _ = engine.rollout(state, act, commands, 0.1, integrator="semi_implicit")
    assert torch.isfinite(states).all()
    assert states[..., 7:].abs().max() < 20.0
    assert not (torch.isfinite(semi).all() and semi[..., 7:].abs().max() < 20.0), \
        "semi-implicit at 100 ms should blow up; otherwise this test does not show implicit is needed"


def test_ani_substeps_keep_coarse_steps_stable_and_close_to_fine():
    robot = load_robot("superball")
    engine = TensegrityEngine(robot, fixed_rods=(0,), floor=False)
    episode = _noncontact_episode(robot, seed=6, steps=200)
    s0, a0, cmds, wr = (torch.as_tensor(x) for x in episode)
    with torch.no_grad():
        fine, _ = engine.rollout(s0, a0, cmds, 1e-3, wrenches=wr, record_every=10)
        coarse, _ = engine.rollout(s0, a0, cmds[::10], 1e-2, integrator="ani", wrenches=wr[::10])
    p = engine.param_values(torch.float64, "cpu")
    assert engine.stable_step(p) < 1e-2
    assert torch.isfinite(coarse).all()
    assert (coarse[..., POS] - fine[..., POS]).abs().max() < 0.05


# ----------------------------------------------------------------------------- collision checker
def test_segment_closest_points_match_brute_force():
    g = torch.Generator().manual_seed(0)
    a0, a1, b0, b1 = (torch.randn(200, 3, generator=g, dtype=torch.float64) for _ in range(4))
    _, _, pa, pb = collision.segment_closest_points(a0, a1, b0, b1)
    dist = (pa - pb).norm(dim=-1)
    s = torch.linspace(0, 1, 401, dtype=torch.float64)
    pts_a = a0[:, None] + s[None, :, None] * (a1 - a0)[:, None]
    pts_b = b0[:, None] + s[None, :, None] * (b1 - b0)[:, None]
    brute = torch.cdist(pts_a, pts_b).flatten(1).min(1).values
    assert (dist <= brute + 1e-12).all()
    assert (brute - dist).max() < 5e-3
    # Parallel segments and the components-first layout give the same distances.
    _, _, pa2, pb2 = collision.segment_closest_points(a0.T, a1.T, b0.T, b1.T, dim=0)
    assert torch.allclose((pa2 - pb2).norm(dim=0), dist)
    # Parallel, overlapping segments offset perpendicular to their direction by 0.3.
    offset = torch.nn.functional.normalize(torch.linalg.cross(a1 - a0, torch.randn(200, 3, generator=g,
                                                                                  dtype=torch.float64)), dim=-1)
    par = collision.segment_closest_points(a0, a1, a0 + 0.3 * offset, a1 + 0.3 * offset)
    assert torch.allclose((par[2] - par[3]).norm(dim=-1), torch.full((200,), 0.3, dtype=torch.float64))


def test_ground_contact_depths():
    robot = load_robot("superball")
    engine = TensegrityEngine(robot)
    state = torch.tensor(initial_rod_state(robot))
    nodes = engine.end_nodes(state)
    contacts = collision.ground_contacts(nodes, torch.tensor(robot.rod_radius), 0.0)
    expected = robot.rod_radius[:, None] - robot.rod_end_nodes[..., 2]
    assert np.allclose(contacts.depth.numpy(), expected)
    assert torch.allclose(nodes, torch.tensor(robot.rod_end_nodes))
    assert torch.allclose(quat_axis(state[:, 3:7]),
                          torch.nn.functional.normalize(nodes[:, 1] - nodes[:, 0], dim=-1))


# ----------------------------------------------------------------------------- config and params
def _superball_dict():
    return yaml.safe_load((CONFIG_DIR / "superball.yaml").read_text())


@pytest.mark.parametrize("mutate, field", [
    (lambda d: d["rods"][2].pop("end_nodes"), "rods[2].end_nodes"),
    (lambda d: d["rods"][1].update(end_nodes=[[0, 0, 0], [0, 0]]), "rods[1].end_nodes[1]"),
    (lambda d: d["cables"][3].update(ends=[[0, 0], [9, 1]]), "cables[3].ends[1]"),
    (lambda d: d["cables"][5].update(ends=[[1, 0], [1, 1]]), "cables[5].ends"),
    (lambda d: d["cables"][0].update(stiffness=-5), "cables[0].stiffness"),
    (lambda d: d["cables"][0].update(command_range=[1.2, 0.6]), "cables[0].command_range"),
    (lambda d: d["cables"][0].update(rest_length=2.0), "cables[0].rest_length"),
    (lambda d: d["rods"][0].update(length=2.0), "rods[0].length"),
    (lambda d: d["actuator"].update(time_constant="fast"), "actuator.time_constant"),
    (lambda d: d["contact"]["friction"].pop("sliding"), "contact.friction.sliding"),
    (lambda d: d.pop("cables"), "config.cables"),
    (lambda d: d["rods"][0].update(mass=float("nan")), "rods[0].mass"),
    (lambda d: d["contact"].update(condim=True), "contact.condim"),         # True == 1: no friction
    # a misspelt optional key would leave its value at the default without a word
    (lambda d: d["actuator"].update(max_sped=0.25), "actuator: unknown key 'max_sped' (did you mean 'max_speed'?)"),
    (lambda d: d["engine"].update(integrater="rk4"), "engine: unknown key 'integrater'"),
    (lambda d: d["cables"][4].update(slack_dampng=0.1), "cables[4]: unknown key 'slack_dampng'"),
    (lambda d: d["cable_defaults"].update(stifness=1.0), "cable_defaults: unknown key 'stifness'"),
    (lambda d: d["rods"][3].update(inertia=2.0), "rods[3]: unknown key 'inertia'"),
    (lambda d: d["contact"]["friction"].update(roling=0.1), "contact.friction: unknown key 'roling'"),
    (lambda d: d["contact"].update(solrf=[0.02, 1.0]), "contact: unknown key 'solrf'"),
    (lambda d: d.update(cable_default={}), "config: unknown key 'cable_default'"),
    (lambda d: d["cable_defaults"].update(actuated=False), "config.cables: no cable is actuated"),
    (lambda d: d["rod_defaults"].update(radius=5.0), "rods[0].radius: 5.0 m is not below half"),   # cm for m
])
def test_bad_config_gives_error_naming_the_field(mutate, field):
    data = copy.deepcopy(_superball_dict())
    mutate(data)
    with pytest.raises(ConfigError) as err:
        robot_from_dict(data, source="test.yaml")
    assert field in str(err.value) and "test.yaml" in str(err.value)


def test_bad_yaml_file_and_missing_config(tmp_path):
    path = tmp_path / "broken.yaml"
    path.write_text("rods: [1, 2\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_robot(path)
    with pytest.raises(ConfigError, match="not found"):
        load_robot("no_such_robot")


def test_parameters_stay_inside_bounds_under_any_raw_value():
    robot = load_robot("superball")
    params = PhysicalParameters(robot, per_element=("cable_stiffness", "rod_mass"))
    with torch.no_grad():
        for spec in PARAM_SPECS:
            getattr(params, spec.name).copy_(torch.full_like(getattr(params, spec.name), 1e6))
    for spec in PARAM_SPECS:
        value = params.value(spec.name)
        lo, hi = params.bounds_of(spec.name)
        # exp(log(hi)) may round one ulp past hi: bounds hold to round-off.
        assert ((value >= lo * (1 - 1e-12)) & (value <= hi * (1 + 1e-12))).all(), spec.name
    assert params.value("cable_stiffness").shape == (24,)
    params.randomize(np.random.default_rng(0))
    names, values = params.flat()
    assert len(names) == len(values) == 24 + 6 + (len(PARAM_SPECS) - 2)
    with pytest.raises(ValueError, match="outside its bounds"):
        PhysicalParameters(robot, values={"rod_mass": 1e4})
    restored = PhysicalParameters(robot, values={"cable_stiffness": 1234.0})
    assert torch.allclose(restored.value("cable_stiffness"), torch.tensor([1234.0], dtype=torch.float64))


def test_mujoco_ground_checker_matches_differentiable_depth_and_drives_the_step():
    """Ablation (c) hook: MuJoCo's capsule-plane depths equal the engine's node depths
    (tolerance 1e-9 m) on penetrating poses, batch [2, 3], and the engine steps with them."""
    from tensegrity_engine.groundtruth.mujoco_twin import MujocoGroundChecker

    robot = load_robot("superball")
    robot = robot.replace(contact=dataclasses.replace(robot.contact, law="penalty"))     # an external ground
    engine = TensegrityEngine(robot)
    s0 = torch.as_tensor(initial_rod_state(robot))
    rng = np.random.default_rng(0)
    states = []
    for b in range(6):
        s = s0.clone()
        low = float(engine.end_nodes(s)[..., 2].min()) - robot.rod_radius[0] - robot.contact.ground_height
        s[:, 2] -= low + 0.002 * (b + 1)                     # 2-12 mm into the floor
        s[:, 2] += torch.as_tensor(rng.normal(scale=0.002, size=robot.num_rods))
        states.append(s)
    S = torch.stack(states).reshape(2, 3, robot.num_rods, 13)
    nodes = engine.end_nodes(S).flatten(-3, -2).transpose(-1, -2)      # [2, 3, 3, 2R]
    ref = (torch.as_tensor(np.repeat(robot.rod_radius, 2)) - (nodes[..., 2, :] - robot.contact.ground_height))
    checker = MujocoGroundChecker(robot)
    depth = checker(nodes.numpy(), np.repeat(robot.rod_radius, 2))
    assert depth.shape == (2, 3, 2 * robot.num_rods)
    assert (depth > 0).sum() >= 6                           # every pose touches the floor
    np.testing.assert_allclose(depth, ref.clamp(min=0).numpy(), atol=1e-9)
    hooked = TensegrityEngine(robot, ground_contact_fn=checker)
    act = engine.initial_act(S)
    for integrator in ("semi_implicit", "implicit"):
        a, _ = engine.step(S, act, act, 1e-3, integrator=integrator)
        b, _ = hooked.step(S, act, act, 1e-3, integrator=integrator)
        assert torch.isfinite(b).all()
        torch.testing.assert_close(a, b, atol=1e-9, rtol=1e-9)
    assert checker.calls == 6 * 3                           # direct call + one query per step


def test_delayed_commands_shift_by_whole_steps_and_interpolate_between():
    from tensegrity_engine.physics.actuators import delayed_commands

    u = torch.as_tensor(np.random.default_rng(3).normal(size=(2, 12, 3)))
    dt = 0.001
    np.testing.assert_array_equal(delayed_commands(u, torch.tensor(0.0, dtype=torch.float64), dt).numpy(), u.numpy())
    late = delayed_commands(u, torch.tensor(3 * dt, dtype=torch.float64), dt)
    np.testing.assert_allclose(late[:, 3:].numpy(), u[:, :-3].numpy(), atol=1e-15)
    np.testing.assert_allclose(late[:, :3].numpy(), u[:, :1].expand(2, 3, 3).numpy())   # first held before
    early = delayed_commands(u, torch.tensor(-2 * dt, dtype=torch.float64), dt)
    np.testing.assert_allclose(early[:, :-2].numpy(), u[:, 2:].numpy(), atol=1e-15)
    half = delayed_commands(u, torch.tensor(1.5 * dt, dtype=torch.float64), dt)
    np.testing.assert_allclose(half[:, 2:].numpy(), 0.5 * (u[:, 1:-1] + u[:, :-2]).numpy(), atol=1e-15)
    d = torch.tensor(2.3 * dt, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda x: delayed_commands(u, x, dt), (d,))


def test_a_config_value_is_held_inside_its_range_only_where_it_means_none_or_sits_on_a_bound(tmp_path):
    """A robot YAML that leaves out the torsional and rolling friction (0: none) or sets a
    slack share of 1 on every cable builds an engine (its values held just inside their
    ranges); a value far outside a range (a 500 kg rod) is an error naming it, not a value
    clipped to another robot's."""
    data = copy.deepcopy(_superball_dict())
    data["contact"]["friction"].pop("torsional")
    data["contact"]["friction"].pop("rolling")
    data["cable_defaults"]["slack_damping"] = 1.0
    robot = robot_from_dict(data, source="test.yaml")
    values = PhysicalParameters(robot).as_dict()
    assert 0 < values["friction_torsional"][0] < 1e-4 and 0.999 < values["cable_slack_damping"][0] < 1.0
    TensegrityEngine(robot)
    heavy = load_robot("superball")
    heavy = heavy.replace(rod_mass=np.where(np.arange(heavy.num_rods) == 0, 500.0, heavy.rod_mass))
    with pytest.raises(ValueError, match="rod_mass .* outside the range"):
        PhysicalParameters(heavy)
    # a caller's narrower bounds (an identification's, a message's) that leave the config's
    # value out are the caller's choice: the value is held inside them, as before
    narrowed = PhysicalParameters(load_robot("superball"), bounds={"cable_stiffness": (1e5, 2e5)})
    assert 1e5 < narrowed.as_dict()["cable_stiffness"][0] < 2e5
    given = PhysicalParameters(load_robot("superball"), values={"cable_stiffness": [1.5e5]},
                               bounds={"cable_stiffness": (1e5, 2e5)})
    assert given.as_dict()["cable_stiffness"][0] == pytest.approx(1.5e5)


def test_a_parameter_file_gives_each_element_the_value_it_says():
    """A file whose rods all weigh 11 kg, for a config whose rods differ: each rod weighs 11
    kg (one shared value would scale the config's profile: 5.5 / 11 / 16.5 kg); a file of
    another robot with the same counts (cables between other ends) is refused."""
    import tempfile

    from tensegrity_engine.physics.config import robot_to_yaml
    from tensegrity_engine.physics.parameter_files import params_from_file

    robot = load_robot("superball")
    profiled = robot.replace(rod_mass=np.linspace(5.0, 10.0, robot.num_rods))
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "p.yaml"
        path.write_text(yaml.safe_dump({"parameters": {"rod_mass": [11.0] * robot.num_rods}}))
        np.testing.assert_allclose(params_from_file(profiled, path).as_dict()["rod_mass"], 11.0)
        data = copy.deepcopy(_superball_dict())
        data["cables"][0]["ends"], data["cables"][1]["ends"] = data["cables"][1]["ends"], data["cables"][0]["ends"]
        other = robot_from_dict(data, source="other.yaml")
        assert (other.num_rods, other.num_cables) == (robot.num_rods, robot.num_cables)
        path.write_text(robot_to_yaml(other.replace(name=robot.name)))
        with pytest.raises(ValueError, match="topology differs"):
            params_from_file(robot, path)


def test_shared_parameter_keeps_the_configs_per_element_profile():
    """Weighed rods (one with a payload) in the config: a shared rod mass is their mean and
    every rod keeps its own mass (the engine steps with them), a learnt shared value scales
    them together, and the config's model equals the engine's with those masses per rod."""
    robot = load_robot("superball")
    masses = np.full(robot.num_rods, 8.0)
    masses[0] = 16.0
    weighed = robot.replace(rod_mass=masses)
    params = PhysicalParameters(weighed)
    assert params.profiled == {"rod_mass"}
    assert params.rod_mass.numel() == 1                              # one raw value, the mean
    assert np.allclose(params.as_dict()["rod_mass"], masses)
    assert float(params.shared_value("rod_mass").detach()) == pytest.approx(masses.mean())
    params.set_value("rod_mass", 2.0 * masses.mean())                # a learnt mean: all scale
    assert np.allclose(params.as_dict()["rod_mass"], 2.0 * masses)
    params.set_value("rod_mass", masses)                             # per element in: its mean
    assert np.allclose(params.as_dict()["rod_mass"], masses)
    # the profile reaches the dynamics: as the same masses per element, not as their mean
    exact = PhysicalParameters(weighed, per_element=("rod_mass",))
    averaged = PhysicalParameters(robot, values={"rod_mass": masses.mean()})
    state, act = environments.rest_pose(weighed)
    state = torch.as_tensor(state, dtype=torch.float64)
    state[:, 7:10] += torch.as_tensor(np.random.default_rng(3).normal(0, 0.3, (robot.num_rods, 3)))
    act = torch.as_tensor(act, dtype=torch.float64)[None]
    commands = act[:, None].expand(1, 50, act.shape[-1])
    ends = {}
    for label, p in (("profiled", params), ("exact", exact), ("averaged", averaged)):
        traj, _ = TensegrityEngine(weighed, params=p).rollout(state[None].clone(), act, commands, weighed.dt)
        ends[label] = traj[:, -1]
    assert torch.allclose(ends["profiled"], ends["exact"], atol=1e-12)
    assert (ends["profiled"] - ends["averaged"]).abs().max() > 1e-4      # the masses matter here
    uniform = PhysicalParameters(robot)
    assert uniform.profiled == frozenset()
    assert uniform.as_dict()["rod_mass"] == pytest.approx([float(robot.rod_mass[0])], rel=1e-12)


def test_profiled_elements_stay_inside_their_bounds_and_survive_a_round_trip():
    """A config value on its bound (one cable's slack share 1, the rest 1e-3): the profiled
    shared value represents it just inside, every element stays within the bounds whatever
    the raw value (learnt, random), and the values pass the consumer's checks (a message)."""
    from tensegrity_engine.physics.params import checked_parameters
    robot = load_robot("superball")
    slack = np.full(robot.num_cables, 1e-3)
    slack[5] = 1.0
    tendon = robot.replace(cable_slack_damping=slack)
    params = PhysicalParameters(tendon)
    assert "cable_slack_damping" in params.profiled
    lo, hi = params.bounds_of("cable_slack_damping")
    got = np.asarray(params.as_dict()["cable_slack_damping"])
    assert np.allclose(got, slack, rtol=1e-5) and (got > lo).all() and (got < hi).all()
    again = checked_parameters(tendon, params.as_dict())
    assert np.allclose(again.as_dict()["cable_slack_damping"], got, rtol=1e-12)
    for raw in (-1e6, 0.0, 1e6):
        with torch.no_grad():
            params.cable_slack_damping.fill_(raw)
        v = params.value("cable_slack_damping")
        assert ((v >= lo * (1 - 1e-12)) & (v <= hi * (1 + 1e-12))).all()
    with pytest.raises(ValueError, match="puts an element outside the bounds"):
        params.set_value("cable_slack_damping", 0.05)      # cable 5 would exceed a share of 1
    params.randomize(np.random.default_rng(0))
    assert (params.value("cable_slack_damping") < hi).all()
