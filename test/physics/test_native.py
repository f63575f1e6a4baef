"""Native (C) semi-implicit rollouts (engine/native) against the torch engine.

Bit-for-bit equality is not reachable: torch's sqrt (MKL) and cos (SLEEF) are not always
correctly rounded, so single steps differ in the last bit, and a contact-rich rollout
amplifies that as it amplifies any rounding (a 1-ulp change of the initial state in torch
itself gives the same divergence). The contact cases therefore compare over a few hundred
steps, where that amplification stays far below the 1e-9 tolerance.
"""
from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from tensegrity_engine.physics import collision, native
from tensegrity_engine.groundtruth import environments
from tensegrity_engine import control as mpc
from tensegrity_engine.physics.params import PhysicalParameters
from tensegrity_engine.physics.engine import TensegrityEngine
from tensegrity_engine.physics.state import center_of_mass, initial_rod_state

from robot_builders import two_rod_robot

GROUPS = {"position": slice(0, 3), "quaternion": slice(3, 7), "velocity": slice(7, 10),
          "angular velocity": slice(10, 13)}


@pytest.fixture(scope="module", autouse=True)
def _threads():
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(old)


def assert_states_close(out, ref, rtol):
    """Every state group agrees at every recorded step to ``rtol``, relative to the
    group's norm over samples and rods at that step (at least 1e-3 of its largest norm over
    the rollout: a robot at rest has no scale of its own)."""
    assert out.shape == ref.shape and out.dtype == ref.dtype
    for name, part in GROUPS.items():
        a, b = out[..., part].movedim(-3, 0), ref[..., part].movedim(-3, 0)
        a, b = a.reshape(a.shape[0], -1), b.reshape(b.shape[0], -1)
        scale = b.norm(dim=1)
        err = (a - b).norm(dim=1) / scale.clamp_min(1e-3 * float(scale.max()) + 1e-300)
        worst = int(err.argmax())
        assert err[worst] <= rtol, f"{name}: relative error {err[worst]:.2e} at record {worst}"


def rollouts(engine, state, act, commands, dt=1e-3, **kw):
    """(native, torch) semi-implicit rollouts of the same inputs."""
    with torch.no_grad():
        ref = engine.rollout(state, act, commands, dt, integrator="semi_implicit", **kw)
        out = native.NativeRollout(engine).rollout(state, act, commands, dt, **kw)
    return out, ref


def launched(robot, rest, velocity, omega):
    """Rest pose [R, 13] moving as a rigid body (CoM velocity, angular velocity)."""
    state = rest.copy()
    com = center_of_mass(state, robot.rod_mass)
    state[:, 7:10] = velocity + np.cross(omega, state[:, 0:3] - com)
    state[:, 10:13] = omega
    return state


# ----------------------------------------------------------------------------- equality
def test_hanging_from_a_fixed_rod_with_random_commands_and_wrenches(superball):
    robot = superball
    engine = TensegrityEngine(robot, floor=False, fixed_rods=(environments.NONCONTACT_FIXED_ROD,))
    episodes = [environments.sample_noncontact_episode(robot, np.random.default_rng(seed), 400) for seed in (0, 1)]
    state, act, commands, wrenches = (torch.tensor(np.stack(x)) for x in zip(*episodes, strict=True))
    wrenches[..., 1:, 3:6] = 5.0 * torch.sin(torch.arange(400.0, dtype=torch.float64) / 50.0)[:, None, None]
    assert wrenches[..., :3].abs().max() > 10.0
    out, ref = rollouts(engine, state, act, commands, wrenches=wrenches)
    assert_states_close(out[0], ref[0], 1e-9)
    torch.testing.assert_close(out[1], ref[1], rtol=1e-12, atol=1e-14)
    assert (out[0][..., 0, :] - state[..., None, 0, :]).abs().max() < 1e-12   # the fixed rod stays
    assert (out[0][..., -1, 1:, :3] - state[:, 1:, :3]).abs().max() > 0.01


def test_floor_contacts_sliding_rolling_spinning(superball):
    """Robot launched from rest with a random CoM velocity and spin: the contacts slide
    (velocity-implicit friction), stick, roll and twist, and native follows torch (the
    penalty law; `test_soft_contact` has the soft law's)."""
    robot = superball.replace(contact=dataclasses.replace(superball.contact, law="penalty"))
    engine = TensegrityEngine(robot)
    rest, act0 = environments.rest_pose(robot)
    rng = np.random.default_rng(2)
    B, S = 4, 300
    state = torch.tensor(np.stack([
        launched(robot, rest, np.r_[rng.uniform(-1.5, 1.5, 2), 0.0],
                 np.r_[rng.uniform(-0.5, 0.5, 2), rng.uniform(-2.0, 2.0)]) for _ in range(B)]))
    commands = torch.tensor(np.stack([environments.random_commands(robot, rng, S, hold_range=(0.05, 0.1))
                                      for _ in range(B)]))
    act = torch.tensor(act0).expand(B, -1)
    out, ref = rollouts(engine, state, act, commands)
    assert_states_close(out[0], ref[0], 1e-9)
    torch.testing.assert_close(out[1], ref[1], rtol=1e-12, atol=1e-14)

    # The case exercises what it claims (torch's trajectory).
    states = ref[0]
    nodes = engine.end_nodes(states)                                      # [B, S, R, 2, 3]
    radius = torch.as_tensor(robot.rod_radius)[:, None]
    loaded = radius - nodes[..., 2] > 0
    assert loaded.flatten(-2).any(-1).double().mean() > 0.9             # in contact most of the time
    lever = nodes - states[..., None, 0:3]
    lever[..., 2] -= radius
    w = states[..., None, 10:13].expand_as(lever)
    slip = (states[..., None, 7:10] + torch.linalg.cross(w, lever))[..., :2].norm(dim=-1)
    eps = engine.friction_smoothing
    assert slip[loaded].max() > 20 * eps and slip[loaded].min() < eps     # sliding and sticking
    spin = states[..., None, 12].expand_as(loaded).abs()
    roll = states[..., None, 10:12].norm(dim=-1).expand_as(loaded)
    assert spin[loaded].max() > 10 * engine.angular_smoothing          # torsional friction
    assert roll[loaded].max() > 10 * engine.angular_smoothing          # rolling friction


def _model_runs(robot, floor: bool, seed: int):
    """Rollouts of ``robot``'s own integrator, torch and native, and native semi-implicit on
    the same inputs: three robots launched on the floor under random commands, or two
    hanging from a fixed rod with pushes and spinning rods. Returns (state, native, torch,
    native semi-implicit), each rollout (states, acts)."""
    if floor:
        rest, act0 = environments.rest_pose(robot)
        rng = np.random.default_rng(seed)
        state = torch.tensor(np.stack([launched(robot, rest, np.r_[rng.uniform(-1.5, 1.5, 2), 0.0],
                                                np.r_[rng.uniform(-0.5, 0.5, 2), rng.uniform(-2.0, 2.0)])
                                       for _ in range(3)]))
        commands = torch.tensor(np.stack([environments.random_commands(robot, rng, 300, hold_range=(0.05, 0.1))
                                          for _ in range(3)]))
        act, wrenches = torch.tensor(act0).expand(3, -1), None
        engine = TensegrityEngine(robot)
    else:
        episodes = [environments.sample_noncontact_episode(robot, np.random.default_rng(s), 400) for s in (0, 1)]
        state, act, commands, wrenches = (torch.tensor(np.stack(x)) for x in zip(*episodes, strict=True))
        state[..., 1:, 10:13] += 3.0
        engine = TensegrityEngine(robot, floor=False, fixed_rods=(environments.NONCONTACT_FIXED_ROD,))
    with torch.no_grad():
        ref = engine.rollout(state, act, commands, 1e-3, wrenches=wrenches)          # the model's own step
        runner = native.NativeRollout(engine)
        assert runner.integrator == robot.integrator
        out = runner.rollout(state, act, commands, 1e-3, wrenches=wrenches)
        semi = native.NativeRollout(engine, integrator="semi_implicit").rollout(state, act, commands, 1e-3,
                                                                                 wrenches=wrenches)
    return state, out, ref, semi


@pytest.mark.parametrize("floor", [False, True])
def test_implicitfast_steps(superball, floor):
    """A model stepped with implicitfast (8x the config's cable damping, 30 % of it on slack
    cables, spinning rods): native follows torch, hanging with pushes and rolling on the
    floor; the semi-implicit kernel on the same values runs away, so the implicit step is
    what the comparison exercises."""
    robot = superball.replace(cable_damping=superball.cable_damping * 8,
                              cable_slack_damping=np.full(superball.num_cables, 0.3), integrator="implicitfast")
    _, out, ref, semi = _model_runs(robot, floor, seed=2)
    assert_states_close(out[0], ref[0], 1e-9)
    gap = (semi[0][..., :3] - ref[0][..., :3]).abs()
    assert not torch.isfinite(gap).all() or gap.max() > 1e-2


@pytest.mark.parametrize("law", [None, "penalty", "soft"])
def test_rk4_steps(superball, law):
    """A model stepped with rk4: native follows torch hanging from a fixed rod with pushes
    and spinning rods (law None) and rolling on the floor under either contact law; the
    semi-implicit kernel on the same inputs differs, so the four stages are what the
    comparison exercises."""
    robot = superball.replace(integrator="rk4")
    if law is not None:
        robot = robot.replace(contact=dataclasses.replace(robot.contact, law=law))
    state, out, ref, semi = _model_runs(robot, law is not None, seed=4)
    assert_states_close(out[0], ref[0], 1e-9)
    torch.testing.assert_close(out[1], ref[1], rtol=1e-12, atol=1e-14)
    if law is not None:
        moved = (ref[0][:, -1, :, :2].mean(-2) - state[..., :2].mean(-2)).norm(dim=-1)
        assert float(moved.min()) > 0.05                                                  # each rolls off
    assert float((semi[0][..., :3] - ref[0][..., :3]).abs().max()) > 1e-6


@pytest.mark.parametrize("gap,floor", [(0.095, False), (0.2, True)])
def test_rod_rod_contact(gap, floor):
    """Two crossing capsules pushed into each other: overlapping from the start, or
    approaching from apart (culled at first, then touching), with and without the floor."""
    robot = two_rod_robot(gap, height=0.049 if floor else 0.6)
    engine = TensegrityEngine(robot, floor=floor)
    state = torch.tensor(initial_rod_state(robot)).expand(3, -1, -1).clone()
    state[:, 1, 9] = torch.tensor([-0.6, -0.8, -1.0])                   # rod 1 falls onto rod 0
    state[:, 0, 9] = 0.3
    state[:, 0, 10:13] = torch.tensor([0.5, -1.0, 2.0])
    commands = torch.tensor([0.45, 0.62], dtype=torch.float64).expand(3, 250, 2)
    act = torch.tensor([0.55, 0.5], dtype=torch.float64).expand(3, 2)
    out, ref = rollouts(engine, state, act, commands)
    assert_states_close(out[0], ref[0], 1e-9)
    nodes = engine.end_nodes(ref[0])
    depth = collision.rod_rod_contacts(nodes, torch.tensor(robot.rod_radius), torch.tensor([0]),
                                       torch.tensor([1])).depth[..., 0]
    first = collision.rod_rod_contacts(engine.end_nodes(state), torch.tensor(robot.rod_radius),
                                       torch.tensor([0]), torch.tensor([1])).depth[..., 0]
    assert (depth > 1e-3).any(-1).all()                                 # every sample collides
    assert ((first > 0) if gap < 0.1 else (first < -0.05)).all()


def test_slack_cables_and_passive_cables(three_bar):
    """The longest commands slacken cables (zero tension) of the 3-bar, whose passive
    cables keep their config rest lengths; then short ones pull them taut again."""
    robot = three_bar
    engine = TensegrityEngine(robot)
    rest, act0 = environments.rest_pose(robot)
    commands = torch.tensor(robot.command_high).expand(2, 300, -1).clone()
    commands[1, 150:] = torch.tensor(robot.command_low)
    state = torch.tensor(rest).expand(2, -1, -1)
    act = torch.tensor(act0).expand(2, -1)
    out, ref = rollouts(engine, state, act, commands)
    assert_states_close(out[0], ref[0], 1e-9)
    tension = engine.cable_tensions(ref[0], ref[1]).detach()
    slack = tension.abs() < 0.1           # only the (default 1e-3) slack share of the damping
    assert slack.double().mean() > 0.1 and (tension[1, -1] > 1.0).all()
    assert (tension[..., ~torch.as_tensor(robot.cable_actuated)] > 1.0).any()


def test_per_element_parameters(superball):
    robot = superball
    rng = np.random.default_rng(4)
    params = PhysicalParameters(robot, values={
        "cable_stiffness": rng.uniform(5e3, 2e4, robot.num_cables),
        "cable_damping": rng.uniform(500.0, 1500.0, robot.num_cables),
        "rod_mass": rng.uniform(8.0, 12.0, robot.num_rods),
        "rod_inertia_factor": rng.uniform(1.0, 2.5, robot.num_rods),
        "cable_slack_damping": rng.uniform(0.01, 0.99, robot.num_cables),
        "actuator_max_speed": 0.2},                                   # winches that hit their limit
        per_element=("cable_stiffness", "cable_damping", "rod_mass", "rod_inertia_factor", "cable_slack_damping"))
    engine = TensegrityEngine(robot, params)
    p = {k: v.detach() for k, v in params.values().items()}
    assert p["cable_stiffness"].shape == (robot.num_cables,) and p["rod_mass"].shape == (robot.num_rods,)
    rest, act0 = environments.rest_pose(robot)
    state = torch.tensor(launched(robot, rest, np.array([1.0, 0.3, 0.0]), np.array([0.0, 0.0, 0.5])))[None]
    commands = torch.tensor(environments.random_commands(robot, rng, 200))[None]
    act = torch.tensor(act0)[None]
    out, ref = rollouts(engine, state, act, commands, params=p)
    assert_states_close(out[0], ref[0], 1e-9)
    nominal = native.NativeRollout(TensegrityEngine(robot)).rollout(state, act, commands, 1e-3)[0]
    assert (nominal - out[0]).abs().max() > 1e-4                         # the parameters reach the kernel


@pytest.mark.parametrize("tau,h,speed", [(0.05, 1e-3, 0.05), (2.1e-3, 2.5e-3, 20.0)])
def test_speed_limited_actuators_match_torch(superball, tau, h, speed):
    """Actuators that leave their speed limit within the step (0 < t1 < h, the exponential of
    the rest of the step: a series for tau >= 2 h, libm below) and that stay on it or off it,
    against torch to rounding, over gaps spanning all three. The exponential multiplies the
    gap left at the knee, speed x tau: the second case's 4 cm (a fast winch) carries its
    rounding into the filter state, the first's 2.5 mm only its gross errors."""
    robot = superball
    params = PhysicalParameters(robot, values={"actuator_max_speed": speed, "actuator_time_constant": tau})
    engine = TensegrityEngine(robot, params)
    rest, act0 = environments.rest_pose(robot)
    batch = 64
    rng = np.random.default_rng(7)
    sizes = speed * (tau + rng.uniform(-h, 2 * h, (batch, act0.size)))    # t1 = 0, 0 < t1 < h, t1 = h by thirds
    gaps = sizes * rng.choice([-1.0, 1.0], (batch, act0.size))
    act = torch.tensor(act0 + gaps)
    t1 = np.clip((np.abs(gaps) - tau * speed) / speed, 0.0, h)
    assert ((t1 > 0) & (t1 < h)).mean() > 0.2 and (t1 == 0).mean() > 0.2 and (t1 == h).mean() > 0.2
    if tau < 2 * h:
        assert ((t1 > 0) & ((h - t1) / tau > 0.5)).mean() > 0.05       # beyond the series
    state = torch.tensor(rest).expand(batch, -1, -1)
    commands = torch.tensor(act0).expand(batch, 5, -1)
    with torch.no_grad():
        ref, ref_act = engine.rollout(state, act, commands, h, integrator="semi_implicit")
        out, out_act = native.NativeRollout(engine).rollout(state, act, commands, h)
    torch.testing.assert_close(out_act, ref_act, rtol=1e-13, atol=1e-15)
    assert_states_close(out, ref, 1e-9)


def test_parameter_changes_reach_a_reused_runner(three_bar):
    """The runner reuses its parameter block only while the same, unmodified tensors come back."""
    engine = TensegrityEngine(three_bar)
    rest, act0 = environments.rest_pose(three_bar)
    args = (torch.tensor(rest), torch.tensor(act0), torch.tensor(act0).expand(50, -1), 1e-3)
    p = {k: v.detach().clone() for k, v in engine.param_values(torch.float64, "cpu").items()}
    runner = native.NativeRollout(engine)
    before = runner.rollout(*args, params=p)[0]
    assert torch.equal(runner.rollout(*args, params=p)[0], before)
    p["rod_mass"].mul_(2.0)                                             # in place
    heavy = runner.rollout(*args, params=p)[0]
    assert torch.equal(heavy, native.NativeRollout(engine).rollout(*args, params=p)[0])
    assert (heavy - before).abs().max() > 1e-6
    p = dict(p, contact_stiffness=p["contact_stiffness"] * 3)           # a new tensor
    assert not torch.equal(runner.rollout(*args, params=p)[0], heavy)


def test_commands_outside_the_range_are_clamped(three_bar):
    robot = three_bar
    engine = TensegrityEngine(robot)
    rest, act0 = environments.rest_pose(robot)
    rng = np.random.default_rng(5)
    low, high = robot.command_low, robot.command_high
    commands = torch.tensor(rng.uniform(low - 0.3, high + 0.3, (2, 200, robot.num_actuated)))
    outside = (commands < torch.tensor(low)) | (commands > torch.tensor(high))
    assert outside.float().mean() > 0.3
    state, act = torch.tensor(rest).expand(2, -1, -1), torch.tensor(act0).expand(2, -1)
    out, ref = rollouts(engine, state, act, commands)
    assert_states_close(out[0], ref[0], 1e-9)
    clamped = native.NativeRollout(engine).rollout(state, act, engine.clamp_command(commands), 1e-3)
    assert torch.equal(clamped[0], out[0]) and torch.equal(clamped[1], out[1])


def test_record_every_and_leading_batch_dims(three_bar):
    robot = three_bar
    engine = TensegrityEngine(robot)
    rest, act0 = environments.rest_pose(robot)
    g = torch.Generator().manual_seed(6)
    state = torch.tensor(rest).expand(2, 3, -1, -1).clone()
    state[..., 7:13] += 0.3 * torch.randn(state[..., 7:13].shape, generator=g, dtype=torch.float64)
    low, high = torch.tensor(robot.command_low), torch.tensor(robot.command_high)
    commands = low + (high - low) * torch.rand(2, 3, 52, robot.num_actuated, generator=g, dtype=torch.float64)
    act = torch.tensor(act0)                                           # unbatched: broadcast
    out, ref = rollouts(engine, state, act, commands, record_every=7)
    assert out[0].shape == (2, 3, 7, robot.num_rods, 13) and out[1].shape == (2, 3, 7, robot.num_actuated)
    assert ref[0].shape == out[0].shape and ref[1].shape == out[1].shape
    assert_states_close(out[0].flatten(0, 1), ref[0].flatten(0, 1), 1e-9)
    torch.testing.assert_close(out[1], ref[1], rtol=1e-12, atol=1e-14)
    every = native.NativeRollout(engine).rollout(state, act, commands, 1e-3)
    assert torch.equal(every[0][..., 6::7, :, :], out[0]) and torch.equal(every[1][..., 6::7, :], out[1])
    held = native.NativeRollout(engine).rollout_held(state, act, commands[..., ::4, :], 1e-3, hold=4,
                                                     record_every=2)
    repeated = native.NativeRollout(engine).rollout(state, act, commands[..., ::4, :].repeat_interleave(4, -2),
                                                    1e-3, record_every=2)
    assert torch.equal(held[0], repeated[0]) and torch.equal(held[1], repeated[1])


def test_actuator_timing_mean(superball):
    robot = superball
    engine = TensegrityEngine(robot, actuator_timing="mean")
    rest, act0 = environments.rest_pose(robot)
    rng = np.random.default_rng(7)
    commands = torch.tensor(environments.random_commands(robot, rng, 150))[None]
    state = torch.tensor(launched(robot, rest, np.array([0.5, -0.5, 0.0]), np.zeros(3)))[None]
    out, ref = rollouts(engine, state, torch.tensor(act0)[None], commands)
    assert_states_close(out[0], ref[0], 1e-9)
    start = native.NativeRollout(TensegrityEngine(robot)).rollout(state, torch.tensor(act0)[None], commands, 1e-3)
    assert (start[0] - out[0]).abs().max() > 1e-6                      # the timing reaches the kernel


def test_fast_spin_takes_the_exact_exponential(three_bar):
    """Rotations above 0.25 rad per half step leave the kernel's series for libm."""
    robot = three_bar
    engine = TensegrityEngine(robot, floor=False)
    g = torch.Generator().manual_seed(11)
    state = torch.tensor(initial_rod_state(robot)).expand(5, -1, -1).clone()
    state[..., 10:13] = 300.0 * torch.randn(5, robot.num_rods, 3, generator=g, dtype=torch.float64)
    half_angle = state[..., 10:13].norm(dim=-1) * 1e-3 / 2
    assert (half_angle > 0.3).any() and (half_angle < 0.2).any()
    act = torch.tensor(robot.cable_rest_length[robot.actuated_indices])
    out, ref = rollouts(engine, state, act, act.expand(5, 8, -1))     # before the spin destabilises it
    assert_states_close(out[0], ref[0], 1e-9)


@pytest.mark.parametrize("integrator", ["semi_implicit", "implicitfast", "rk4"])
def test_float32_agrees_like_torch_float32(superball, integrator):
    """float32 (the planner's default) native rollouts stay as close to float64 as torch's
    float32 does, for every model integrator (the penalty law; the soft law's float32:
    `test_soft_contact`)."""
    robot = superball.replace(integrator=integrator,
                              contact=dataclasses.replace(superball.contact, law="penalty"))
    engine = TensegrityEngine(robot)
    rest, act0 = environments.rest_pose(robot)
    rng = np.random.default_rng(8)
    state = np.stack([launched(robot, rest, np.r_[rng.uniform(-1, 1, 2), 0.0], np.r_[0.0, 0.0, rng.uniform(-1, 1)])
                      for _ in range(3)])
    commands = np.stack([environments.random_commands(robot, rng, 200, hold_range=(0.05, 0.1)) for _ in range(3)])
    act = np.repeat(act0[None], 3, 0)
    with torch.no_grad():
        ref64, _ = engine.rollout(*(torch.tensor(x) for x in (state, act, commands)), 1e-3)
        f32 = [torch.tensor(x, dtype=torch.float32) for x in (state, act, commands)]
        torch32, _ = engine.rollout(*f32, 1e-3)
    out32, acts32 = native.NativeRollout(engine).rollout(*f32, 1e-3)
    assert out32.dtype == acts32.dtype == torch.float32
    for name, part in GROUPS.items():
        scale = ref64[..., part].norm()
        native_err = (out32[..., part].double() - ref64[..., part]).norm() / scale
        torch_err = (torch32[..., part].double() - ref64[..., part]).norm() / scale
        # the same order: two float32 sums in another order part over 200 steps with contacts
        # (implicitfast's angular velocity measured 2.0e-4 against 3.6e-5 on an AMD EPYC,
        # within 3x on an Intel Xeon)
        assert native_err < max(10 * torch_err, 1e-6) and native_err < 1e-3, (name, native_err, torch_err)


def test_a_batch_tail_runs_in_narrow_chunks_that_keep_threads_busy():
    """The kernel splits a batch into rounds of one wide chunk per thread, then runs the
    rest as narrow chunks when one per thread covers it (MPPI's 40 samples on 2 threads:
    2 + 2 wide, then 1 + 1 narrow, not 3 + 2 wide)."""
    lanes = native.LANES[torch.float32]
    half = lanes // 2
    assert native.chunk_schedule(5 * lanes, 2) == {"threads": 2, "wide": 4, "narrow": 2, "narrow_start": 4 * lanes}
    assert native.chunk_schedule(5 * lanes, 1) == {"threads": 1, "wide": 5, "narrow": 0, "narrow_start": 5 * lanes}
    assert native.chunk_schedule(2 * lanes + 1, 1) == {"threads": 1, "wide": 2, "narrow": 1,
                                                       "narrow_start": 2 * lanes}
    # A rest that would need two narrow chunks on one thread stays wide.
    assert native.chunk_schedule(2 * lanes + half + 1, 1) == {"threads": 1, "wide": 3, "narrow": 0,
                                                              "narrow_start": 2 * lanes + half + 1}
    # One wide chunk's samples on 2 or more threads: a narrow chunk each, on 2 threads.
    assert native.chunk_schedule(lanes, 4) == {"threads": 2, "wide": 0, "narrow": 2, "narrow_start": 0}
    assert native.chunk_schedule(1, 2) == {"threads": 1, "wide": 0, "narrow": 1, "narrow_start": 0}
    # Every sample in exactly one chunk, never more threads than chunks or narrow chunks.
    for threads in range(1, 6):
        for batch in range(1, 81):
            plan = native.chunk_schedule(batch, threads)
            covered = [s for c in range(plan["wide"]) for s in range(c * lanes, (c + 1) * lanes)]
            covered += [plan["narrow_start"] + s for s in range(plan["narrow"] * half)]
            assert sorted(s for s in covered if s < batch) == list(range(batch)), (batch, threads, plan)
            assert len(covered) - batch < (lanes if plan["narrow"] == 0 else half), (batch, threads, plan)
            assert 1 <= plan["threads"] <= min(threads, plan["wide"] + plan["narrow"])
            assert plan["narrow"] <= plan["threads"]


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_two_threads_give_the_same_result(superball, dtype):
    """The same samples in wide and narrow chunks (the 2-thread run puts the last 5 in
    narrow ones, the 1-thread run in a wide one; alone, a sample is a narrow chunk) give
    bitwise the same steps, soft ground contacts included: a lane's solve does not depend on
    the lanes beside it."""
    robot = superball
    engine = TensegrityEngine(robot)
    rest, act0 = environments.rest_pose(robot)
    rng = np.random.default_rng(9)
    B = 21                                                              # 3 chunks, the last one partial
    state = torch.tensor(np.stack([launched(robot, rest, np.r_[rng.uniform(-1.5, 1.5, 2), 0.0],
                                            np.r_[rng.uniform(-0.5, 0.5, 2), rng.uniform(-2.0, 2.0)])
                                   for _ in range(B)]), dtype=dtype)
    commands = torch.tensor(rng.uniform(robot.command_low, robot.command_high, (B, 300, robot.num_actuated)),
                            dtype=dtype)
    act = torch.tensor(act0, dtype=dtype).expand(B, -1)
    runner = native.NativeRollout(engine)
    assert native.chunk_schedule(B, 1, dtype)["narrow"] == 0
    assert native.chunk_schedule(B, 2, dtype)["narrow"] == 2
    one = runner.rollout(state, act, commands, 1e-3, threads=1)
    two = runner.rollout(state, act, commands, 1e-3, threads=2)
    assert torch.equal(one[0], two[0]) and torch.equal(one[1], two[1])
    for b in range(B):                                                  # each sample alone: one narrow chunk
        alone = runner.rollout(state[b:b + 1], act[b:b + 1], commands[b:b + 1], 1e-3)
        assert torch.equal(alone[0], one[0][b:b + 1]), b
    # The soft ground is really solved: every sample touches the floor most of the time.
    nodes = engine.end_nodes(one[0].double())
    touching = (nodes[..., 2] < torch.as_tensor(robot.rod_radius)[:, None]).flatten(2).any(-1)   # [B, S]
    assert touching.double().mean(-1).min() > 0.5


# ----------------------------------------------------------------------------- planning
def test_engine_dynamics_native_backend(three_bar):
    robot = three_bar
    s0, a0 = mpc.task_start(robot)
    plans = torch.as_tensor(np.random.default_rng(10).uniform(robot.command_low, robot.command_high,
                                                               (5, 3, robot.num_actuated)))
    default = mpc.EngineDynamics(robot, control_dt=0.02)
    assert default.backend == "native" and not default.compile
    fast = mpc.EngineDynamics(robot, control_dt=0.02, dtype=torch.float64, backend="native")
    slow = mpc.EngineDynamics(robot, control_dt=0.02, dtype=torch.float64, backend="torch", compile=False)
    out = fast(s0, a0, plans)
    assert out.shape == (5, 3, robot.num_rods, 13)
    assert_states_close(out, slow(s0, a0, plans), 1e-9)
    assert mpc.EngineDynamics(robot, compile=False).backend == "torch"
    with pytest.raises(ValueError, match="semi_implicit"):
        mpc.EngineDynamics(robot, integrator="implicit", backend="native")
    with pytest.raises(ValueError, match="backend"):
        mpc.EngineDynamics(robot, backend="cuda")
    ctrl = mpc.MPPIController(robot, config=mpc.PlannerConfig(horizon=2, num_samples=6, iterations=2),
                              backend="native")
    command = ctrl.plan(s0, a0)
    assert command.shape == (robot.num_actuated,) and np.isfinite(command).all()


# ----------------------------------------------------------------------------- errors
def test_missing_or_failing_compiler_gives_a_clear_error(three_bar, monkeypatch, tmp_path):
    engine = TensegrityEngine(three_bar)
    rest, act0 = environments.rest_pose(three_bar)
    args = (torch.tensor(rest), torch.tensor(act0), torch.tensor(act0).expand(3, -1), 1e-3)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.setenv("CC", "/nonexistent/cc")
    with pytest.raises(native.NativeBuildError, match="/nonexistent/cc") as err:
        native.NativeRollout(engine).rollout(*args)
    assert "--backend torch" in str(err.value)
    with pytest.raises(native.NativeBuildError, match="/nonexistent/cc"):
        mpc.EngineDynamics(three_bar, backend="native")
    monkeypatch.setenv("CC", "cc -include no_such_header_here.h")
    with pytest.raises(native.NativeBuildError, match=r"no_such_header_here\.h"):
        native.NativeRollout(engine).rollout(*args)
    assert not any((tmp_path / "tensegrity_ros" / "native").glob("*.so"))


def test_builds_into_the_cache_once(three_bar, monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    library = native.load_library(torch.float64)
    cache = tmp_path / "tensegrity_ros" / "native"
    built = sorted(cache.iterdir())
    assert len(built) == 1 and built[0].suffix == ".so"                 # no leftover build directory
    assert native.load_library(torch.float64) is library
    native._LIBRARIES.clear()
    native.load_library(torch.float64)
    assert sorted(cache.iterdir()) == built


def test_rejects_what_it_cannot_run(three_bar):
    engine = TensegrityEngine(three_bar)
    rest, act0 = environments.rest_pose(three_bar)
    state, act = torch.tensor(rest), torch.tensor(act0)
    commands = act.expand(3, -1)
    runner = native.NativeRollout(engine)
    with pytest.raises(ValueError, match="CPU"):
        runner.rollout(state.to("meta"), act.to("meta"), commands.to("meta"), 1e-3)
    with pytest.raises(ValueError, match="forward-only"):
        runner.rollout(state.clone().requires_grad_(True), act, commands, 1e-3)
    with pytest.raises(ValueError, match="forward-only"):
        runner.rollout(state, act, commands, 1e-3, params=engine.param_values(torch.float64, "cpu"))
    with pytest.raises(TypeError, match="float32 and float64"):
        runner.rollout(state.half(), act.half(), commands.half(), 1e-3)
    bad = {k: v.detach() for k, v in engine.param_values(torch.float64, "cpu").items()}
    bad["contact_stiffness"] = bad["contact_stiffness"].expand(2)
    with pytest.raises(ValueError, match="contact_stiffness"):
        runner.rollout(state, act, commands, 1e-3, params=bad)
    with pytest.raises(ValueError, match="ground_contact_fn"):
        native.NativeRollout(TensegrityEngine(three_bar, ground_contact_fn=lambda nodes, radius: 0))
    with pytest.raises(ValueError, match="native kernel steps semi_implicit, implicitfast or rk4"):
        native.NativeRollout(engine, integrator="ani")


def _cpu_has(flag: str) -> bool:
    try:
        with open("/proc/cpuinfo") as fh:
            return any(line.startswith("flags") and flag in line.split() for line in fh)
    except OSError:
        return False


@pytest.mark.skipif(not _cpu_has("avx2"), reason="needs a CPU with AVX2")
def test_an_avx2_build_runs_the_same_steps(superball, monkeypatch, tmp_path):
    """TENSEGRITY_NATIVE_MARCH=x86-64-v3 builds the kernel an AVX2-only CPU runs (on any
    newer one too, so its speed can be measured here): rolling contacts as the native build,
    to rounding of the vectorised libm calls."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    engine = TensegrityEngine(superball)
    rest, act0 = environments.rest_pose(superball)
    rng = np.random.default_rng(4)
    state = torch.tensor(np.stack([launched(superball, rest, np.r_[rng.uniform(-1.5, 1.5, 2), 0.0],
                                            np.r_[0.0, 0.0, rng.uniform(-2, 2)]) for _ in range(9)]))
    commands = torch.tensor(rng.uniform(superball.command_low, superball.command_high, (9, 200, 24)))
    act = torch.tensor(act0).expand(9, -1)
    runner = native.NativeRollout(engine)
    reference = runner.rollout(state, act, commands, 1e-3)
    monkeypatch.setenv(native.MARCH_ENV, "x86-64-v3")
    assert native.kernel_isa() == "AVX2" and "-march=x86-64-v3" in native.compile_flags(torch.float64)
    avx2 = runner.rollout(state, act, commands, 1e-3)
    assert len(list((tmp_path / "tensegrity_ros" / "native").glob("*.so"))) == 2      # two builds, both kept
    assert_states_close(avx2[0], reference[0], 1e-9)
    monkeypatch.setenv(native.MARCH_ENV, "native; rm -rf /")
    with pytest.raises(native.NativeBuildError, match="not a -march value"):
        runner.rollout(state, act, commands, 1e-3)


def test_forward_rollout_is_native_without_gradients_and_torch_with_them(superball):
    """`native.forward_rollout` (evaluation's rollout) runs the C kernel where no gradient
    is wanted, the torch engine where one is; both give the engine's steps."""
    engine = TensegrityEngine(superball)
    rest, act0 = environments.rest_pose(superball)
    rng = np.random.default_rng(4)
    state = torch.tensor(np.stack([launched(superball, rest, np.r_[rng.uniform(-1, 1, 2), 0.0],
                                            np.r_[0.0, 0.0, 1.0]) for _ in range(2)]))
    commands = torch.tensor(np.stack([environments.random_commands(superball, rng, 200, hold_range=(0.05, 0.1))
                                      for _ in range(2)]))
    act = torch.tensor(act0).expand(2, -1)
    calls = []
    original = native.NativeRollout.rollout_held
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(native.NativeRollout, "rollout_held",
                   lambda self, *a, **kw: calls.append(1) or original(self, *a, **kw))
        with torch.no_grad():
            fast = native.forward_rollout(engine, state, act, commands, 1e-3, record_every=10)
        assert calls == [1]
        p = {k: v.detach().requires_grad_(k == "cable_stiffness")
             for k, v in engine.param_values(torch.float64, "cpu").items()}
        slow = native.forward_rollout(engine, state, act, commands, 1e-3, record_every=10, params=p)
        assert calls == [1] and slow[0].requires_grad
    assert_states_close(fast[0], slow[0].detach(), 1e-9)
