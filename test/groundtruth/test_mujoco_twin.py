"""MuJoCo twin: model generation, state conversion, rollouts, cable law, environments."""
import mujoco
import numpy as np
import pytest

from tensegrity_engine.groundtruth import mujoco_twin as mt
from tensegrity_engine.physics.config import load_robot
from tensegrity_engine.groundtruth.environments import (contact_twin, hanging_pose, noncontact_twin,
                                            random_commands, rest_pose, sample_contact_episode,
                                            sample_noncontact_episode)
from tensegrity_engine.groundtruth.mujoco_twin import MujocoTwin, build_mjcf, nominal_commands
from tensegrity_engine.physics.state import (center_of_mass, end_nodes, initial_rod_state,
                                     quat_to_matrix)


def _random_state(robot, rng, batch):
    rs = np.zeros((batch, robot.num_rods, 13))
    rs[..., 0:3] = rng.normal(size=(batch, robot.num_rods, 3))
    q = rng.normal(size=(batch, robot.num_rods, 4))
    rs[..., 3:7] = q / np.linalg.norm(q, axis=-1, keepdims=True)
    rs[..., 7:13] = rng.normal(size=(batch, robot.num_rods, 6))
    return rs


@pytest.mark.parametrize("name", ["superball", "three_bar"])
def test_mjcf_compiles_and_matches_config(name):
    robot = load_robot(name)
    model = mujoco.MjModel.from_xml_string(build_mjcf(robot))
    R, C, A = robot.num_rods, robot.num_cables, robot.num_actuated
    assert (model.nq, model.nv, model.nu, model.na, model.ntendon) == (7 * R, 6 * R, C, A, C)
    assert model.opt.timestep == robot.dt
    assert model.opt.integrator == mujoco.mjtIntegrator.mjINT_EULER
    np.testing.assert_array_equal(model.opt.gravity, robot.gravity)
    np.testing.assert_array_equal(model.body_mass[1:], robot.rod_mass)
    np.testing.assert_allclose(model.body_inertia[1:], robot.rod_inertia(), rtol=1e-12)
    np.testing.assert_allclose(model.body_ipos[1:], 0.0, atol=1e-15)
    # actuated cables first (filterexact), passive cables after (no dynamics)
    dyn = model.actuator_dyntype
    assert np.all(dyn[:A] == mujoco.mjtDyn.mjDYN_FILTEREXACT)
    assert np.all(dyn[A:] == mujoco.mjtDyn.mjDYN_NONE)
    if name == "three_bar":
        assert C - A == 3
    # welded rod: one joint fewer, nothing else changes
    fixed = mujoco.MjModel.from_xml_string(build_mjcf(robot, fixed_rods=(0,), floor=False))
    assert fixed.nq == 7 * (R - 1) and fixed.ngeom == R and fixed.nu == C


def test_rod_rod_collision_bits(superball):
    on = MujocoTwin(superball, nthread=1).model
    off = MujocoTwin(superball.replace(contact=superball.contact.__class__(
        **{**superball.contact.__dict__, "rod_rod": False})), nthread=1).model

    def collide(m, g1, g2):
        return bool((m.geom_contype[g1] & m.geom_conaffinity[g2])
                    or (m.geom_contype[g2] & m.geom_conaffinity[g1]))

    assert collide(on, 1, 2) and collide(on, 0, 1)          # geom 0 = floor
    assert not collide(off, 1, 2) and collide(off, 0, 1)
    assert on.geom_condim[1] == 6 and on.geom_friction[1][2] == 0.001


@pytest.mark.parametrize("fixed", [(), (0,)])
def test_state_round_trip_and_angular_velocity_frame(three_bar, fixed):
    twin = MujocoTwin(three_bar, fixed_rods=fixed, floor=False, nthread=1)
    rng = np.random.default_rng(0)
    rs = _random_state(three_bar, rng, 4)
    act = rng.uniform(0.5, 0.9, size=(4, three_bar.num_actuated))
    mj = twin.mj_state_from(rs, act)
    assert mj.shape == (4, twin.nstate)
    back, act_back = twin.rod_state_from(mj)
    free = [r for r in range(three_bar.num_rods) if r not in fixed]
    expected = rs.copy()
    expected[..., 3:7] *= np.where(expected[..., 3:4] < 0, -1.0, 1.0)
    np.testing.assert_allclose(back[:, free], expected[:, free], atol=1e-12)
    np.testing.assert_allclose(act_back, act, atol=0)
    if fixed:
        np.testing.assert_allclose(back[:, 0], np.broadcast_to(initial_rod_state(three_bar)[0], (4, 13)))
    # MuJoCo itself must see the world-frame angular velocity we passed in
    d = mujoco.MjData(twin.model)
    mujoco.mj_setState(twin.model, d, mj[1], mt.FULLPHYSICS)
    mujoco.mj_forward(twin.model, d)
    for r in free:
        vel = np.zeros(6)
        mujoco.mj_objectVelocity(twin.model, d, mujoco.mjtObj.mjOBJ_BODY, int(twin.body_ids[r]), vel, 0)
        np.testing.assert_allclose(vel[:3], rs[1, r, 10:13], atol=1e-12)   # world omega
        np.testing.assert_allclose(vel[3:], rs[1, r, 7:10], atol=1e-12)    # centre velocity
    # ... and the rod axis is body z
    ax = quat_to_matrix(rs[1, free, 3:7])[..., :, 2]
    np.testing.assert_allclose(d.xmat[twin.body_ids[free]].reshape(-1, 3, 3)[..., :, 2], ax, atol=1e-12)


def test_rollout_equals_mj_step(superball, monkeypatch):
    twin = MujocoTwin(superball, nthread=2)
    rng = np.random.default_rng(1)
    B, S, k = 3, 40, 5
    s0 = np.broadcast_to(initial_rod_state(superball), (B, 6, 13)).copy()
    s0[..., 2] += 0.85                      # just above the floor: contacts happen
    s0[..., 7:13] = rng.normal(scale=0.3, size=(B, 6, 6))
    a0 = np.broadcast_to(nominal_commands(superball), (B, 24))
    cmd = a0[:, None, :] + rng.uniform(-0.2, 0.2, size=(B, S, 24))
    wrench = rng.normal(scale=30.0, size=(B, S, 6, 6))
    rs, acts = twin.rollout(s0, a0, cmd, wrench, record_every=k)
    assert rs.shape == (B, S // k, 6, 13) and acts.shape == (B, S // k, 24)
    contacts = 0
    for b in range(B):
        twin.reset(s0[b], a0[b])
        for i in range(S):
            twin.step(cmd[b, i], wrench[b, i])
            contacts += twin.data.ncon
            if (i + 1) % k == 0:
                st, ac = twin.get_state()
                np.testing.assert_allclose(st, rs[b, (i + 1) // k - 1], atol=1e-10)
                np.testing.assert_allclose(ac, acts[b, (i + 1) // k - 1], atol=1e-12)
    assert contacts > 0
    # batch chunking (small output buffer) gives the same answer
    monkeypatch.setattr(mt, "_ROLLOUT_BUFFER_FLOATS", S * twin.nstate)
    rs2, acts2 = twin.rollout(s0, a0, cmd, wrench, record_every=k)
    np.testing.assert_array_equal(rs2, rs)
    np.testing.assert_array_equal(acts2, acts)


def _expected_tension(robot, rs, rest):
    nodes = end_nodes(rs, 0.5 * robot.rod_length)                      # [R, 2, 3]
    axis = quat_to_matrix(rs[:, 3:7])[..., :, 2]
    half = 0.5 * robot.rod_length[:, None, None] * np.array([-1.0, 1.0])[None, :, None]
    arm = axis[:, None, :] * half
    node_vel = rs[:, None, 7:10] + np.cross(rs[:, None, 10:13], arm)
    (r0, e0), (r1, e1) = robot.cable_ends[:, 0].T, robot.cable_ends[:, 1].T
    d = nodes[r1, e1] - nodes[r0, e0]
    length = np.linalg.norm(d, axis=-1)
    ldot = np.sum(d / length[:, None] * (node_vel[r1, e1] - node_vel[r0, e0]), axis=-1)
    share = robot.cable_slack_damping
    raw = robot.cable_stiffness * (length - rest) + (1.0 - share) * robot.cable_damping * ldot
    return np.maximum(raw, 0.0) + share * robot.cable_damping * ldot, length, raw


@pytest.mark.parametrize("name", ["superball", "three_bar"])
def test_cables_are_tension_only_spring_dampers(name):
    """Tension-only spring-dampers plus the slack share of the damping (the tendon's)."""
    robot = load_robot(name)
    robot = robot.replace(cable_slack_damping=np.linspace(1e-3, 0.9, robot.num_cables))
    twin = MujocoTwin(robot, floor=False, nthread=1)
    rng = np.random.default_rng(2)
    base = initial_rod_state(robot)
    R, C = robot.num_rods, robot.num_cables
    n_slack = n_taut = 0
    for trial in range(6):
        rs = base.copy()
        rs[:, 0:3] += rng.normal(scale=0.08, size=(R, 3))
        rs[:, 7:13] = 0.0 if trial < 3 else rng.normal(scale=0.05, size=(R, 6))
        act = rng.uniform(robot.command_low, robot.command_high)
        rest = robot.cable_rest_length.copy()
        rest[robot.actuated_indices] = robot.actuator.gain * act + robot.actuator.offset
        expected, length, raw = _expected_tension(robot, rs, rest)
        got = twin.cable_tensions(rs, act)
        assert got.shape == (C,)
        if trial < 3:                                  # at rest a slack cable carries nothing
            assert np.all(got[raw <= 0] == 0.0)
        np.testing.assert_allclose(got, expected, rtol=1e-9, atol=1e-9)
        if trial < 3:                                  # static: slack <=> shorter than rest
            np.testing.assert_array_equal(got == 0.0, length <= rest)
        n_slack += np.sum(raw < 0)
        n_taut += np.sum(raw > 0)
    assert n_slack > 0 and n_taut > 0
    # all actuated cables let out beyond their length: no force at all (SUPERball: all)
    act = robot.command_high
    rest = robot.cable_rest_length.copy()
    rest[robot.actuated_indices] = robot.actuator.gain * act + robot.actuator.offset
    lengths = twin.cable_lengths(base)
    got = twin.cable_tensions(base, act)
    slack = lengths < rest
    assert np.all(got[slack] == 0.0) and np.all(got[~slack] > 0.0)
    if name == "superball":
        assert slack.all()


def test_commands_outside_range_are_clipped(superball):
    twin = MujocoTwin(superball, floor=False, nthread=1)
    s0, a0 = initial_rod_state(superball), nominal_commands(superball)
    S = 300
    crazy = np.where(np.arange(24) % 2 == 0, 5.0, -1.0)
    clipped = np.clip(crazy, superball.command_low, superball.command_high)
    rs_c, act_c = twin.rollout(s0, a0, np.broadcast_to(crazy, (1, S, 24)), record_every=10)
    rs_k, act_k = twin.rollout(s0, a0, np.broadcast_to(clipped, (1, S, 24)), record_every=10)
    np.testing.assert_array_equal(act_c, act_k)
    np.testing.assert_array_equal(rs_c, rs_k)
    assert act_c.max() <= superball.command_high.max() and act_c.min() >= superball.command_low.min()
    np.testing.assert_allclose(act_c[0, -1], clipped, atol=1e-2)   # 6 tau: filter converged


def test_noncontact_env_fixed_rod_stays_put(superball):
    twin = noncontact_twin(superball, nthread=2)
    rng = np.random.default_rng(3)
    s0, a0, cmd, wrench = sample_noncontact_episode(superball, rng, 600)
    assert cmd.shape == (600, 24) and wrench.shape == (600, 6, 6)
    assert np.all(cmd >= superball.command_low) and np.all(cmd <= superball.command_high)
    assert np.all(wrench[:, 0] == 0) and np.all(wrench[:, :, 3:] == 0)
    assert np.abs(wrench[:, 1:, :3]).max() > 0
    # piecewise constant, hold >= 0.1 s
    switches = np.flatnonzero(np.any(np.diff(cmd[:, 0:1], axis=0) != 0, axis=1))
    assert np.all(np.diff(switches) >= 100)
    hang, _ = hanging_pose(superball)
    assert np.abs(hang[:, 7:13]).max() < 1e-3
    # push rod 0 as well: the twin must ignore it; MuJoCo's own pose of rod 0 must not move
    wrench[:, 0, :3] = 500.0
    twin.reset(s0, a0)
    x0, q0 = twin.data.xpos[twin.body_ids[0]].copy(), twin.data.xquat[twin.body_ids[0]].copy()
    for i in range(0, 600, 20):
        twin.step(cmd[i], wrench[i], nsteps=20)
    np.testing.assert_array_equal(twin.data.xpos[twin.body_ids[0]], x0)
    np.testing.assert_array_equal(twin.data.xquat[twin.body_ids[0]], q0)
    np.testing.assert_allclose(x0, initial_rod_state(superball)[0, 0:3], atol=1e-12)
    end, _ = twin.get_state()
    moved = np.linalg.norm(end[1:, 0:3] - s0[1:, 0:3], axis=-1)
    assert moved.max() > 0.01                       # the rest of the robot does move


def test_rest_pose_on_floor(superball, three_bar):
    rs, act = rest_pose(superball)
    # SUPERball rests on a triangular face: 3 rods touch, CoM ~0.79 m high
    com = center_of_mass(rs, superball.rod_mass)
    assert 0.70 < com[2] < 0.85
    assert np.abs(rs[:, 7:13]).max() < 1e-3
    np.testing.assert_allclose(act, nominal_commands(superball))
    nodes = end_nodes(rs, 0.5 * superball.rod_length)
    lowest = nodes[..., 2].min(-1) - superball.rod_radius
    assert np.sum(lowest < 0.005) == 3 and lowest.min() > -0.005
    twin = contact_twin(superball, nthread=1)
    twin.reset(rs, act)
    assert twin.data.ncon == 3
    rs3, _ = rest_pose(three_bar)              # prism stands on its bottom triangle
    assert 0.40 < center_of_mass(rs3, three_bar.rod_mass)[2] < 0.55


def test_contact_sampler_rolls(superball):
    twin = contact_twin(superball, nthread=2)
    rng = np.random.default_rng(4)
    s0, a0, cmd = sample_contact_episode(superball, rng, 2000, speed_range=(1.5, 2.0))
    m = superball.rod_mass
    v_com = (s0[:, 7:10] * m[:, None]).sum(0) / m.sum()
    assert 1.5 <= np.linalg.norm(v_com) <= 2.0 and abs(v_com[2]) < 1e-12
    np.testing.assert_allclose(cmd, np.broadcast_to(nominal_commands(superball), cmd.shape))
    rs, _ = twin.rollout(s0, a0, cmd, record_every=2000)
    disp = center_of_mass(rs[0, -1], m)[:2] - center_of_mass(s0, m)[:2]
    assert np.linalg.norm(disp) > 0.3
    assert disp @ v_com[:2] > 0                      # it went where it was pushed


def test_random_commands_shapes(three_bar):
    rng = np.random.default_rng(5)
    cmd = random_commands(three_bar, rng, 1500)
    assert cmd.shape == (1500, 6)
    assert np.all(cmd >= three_bar.command_low) and np.all(cmd <= three_bar.command_high)
    assert len(np.unique(cmd[:, 0])) >= 3


def test_a_command_delay_survives_yaml_and_is_refused_by_the_twin(superball, tmp_path):
    """``actuator.delay`` is a timing of the data (dead time + mocap latency): it travels
    with a robot's YAML, but MuJoCo plays no dead time, so a twin refuses it rather than
    silently playing a robot without it."""
    import dataclasses

    from tensegrity_engine.physics.config import robot_to_yaml

    late = superball.replace(actuator=dataclasses.replace(superball.actuator, delay=0.02))
    path = tmp_path / "late.yaml"
    path.write_text(robot_to_yaml(late))
    assert load_robot(path).actuator.delay == 0.02
    assert load_robot("superball").actuator.delay == 0.0
    with pytest.raises(ValueError, match="plays no command dead time"):
        MujocoTwin(late, nthread=1)


@pytest.mark.parametrize("actuation", ["filter", "motor"])
def test_substeps_play_the_robot_at_a_finer_step_behind_the_same_interface(superball, actuation, monkeypatch):
    """A realisation with ``substeps`` n steps MuJoCo at dt / n with every command held over
    its n steps: its rollout and its live steps are those of the same robot built at dt / n
    and given each command n times, recorded every n-th step; and the finer step changes
    the motion (else the option would do nothing)."""
    import dataclasses
    from tensegrity_engine.groundtruth.realisation import Actuation, Realisation

    act = Actuation(kind=actuation, max_speed=0.3, deadband=0.001) if actuation == "motor" else Actuation()
    real = Realisation(integrator="implicitfast", actuation=act, substeps=4)
    coarse = Realisation(integrator="implicitfast", actuation=act)
    fine_robot = dataclasses.replace(superball, dt=superball.dt / 4)
    rng = np.random.default_rng(3)
    S, k = 30, 3
    s0 = initial_rod_state(superball).copy()
    s0[..., 2] += 0.85
    s0[..., 7:13] = rng.normal(scale=0.3, size=(6, 6))
    a0 = nominal_commands(superball)
    cmd = a0[None] + rng.uniform(-0.2, 0.2, size=(S, 24))
    wrench = rng.normal(scale=30.0, size=(S, 6, 6))
    played = MujocoTwin(superball, nthread=1, realisation=real)
    assert played.model.opt.timestep == pytest.approx(superball.dt / 4)
    rs, acts = played.rollout(s0, a0, cmd, wrench, record_every=k)
    assert rs.shape == (1, S // k, 6, 13)
    fine = MujocoTwin(fine_robot, nthread=1, realisation=coarse)
    rs_f, acts_f = fine.rollout(s0, a0, np.repeat(cmd, 4, 0), np.repeat(wrench, 4, 0), record_every=4 * k)
    np.testing.assert_allclose(rs, rs_f, atol=1e-12)
    np.testing.assert_allclose(acts, acts_f, atol=1e-12)
    played.reset(s0, a0)
    for i in range(k):
        played.step(cmd[i], wrench[i])
    st, ac = played.get_state()
    np.testing.assert_allclose(st, rs[0, 0], atol=1e-10)
    np.testing.assert_allclose(ac, acts[0, 0], atol=1e-12)
    assert played.time == pytest.approx(k * superball.dt)
    rs_1, _ = MujocoTwin(superball, nthread=1, realisation=coarse).rollout(s0, a0, cmd, wrench, record_every=k)
    assert np.abs(rs_1[..., :3] - rs[..., :3]).max() > 1e-6
    # an episode whose every sub-step would not fit the rollout buffer is stepped in Python, the same
    monkeypatch.setattr(mt, "_ROLLOUT_BUFFER_FLOATS", 4 * S * played.nstate - 1)
    rs_loop, acts_loop = played.rollout(s0, a0, cmd, wrench, record_every=k)
    np.testing.assert_allclose(rs_loop, rs, atol=1e-10)
    np.testing.assert_allclose(acts_loop, acts, atol=1e-12)


def test_substeps_must_be_a_positive_integer():
    from tensegrity_engine.groundtruth.realisation import Realisation

    assert Realisation.from_dict({"substeps": 5}).substeps == 5
    for bad in (0, -1, 2.5, True):
        with pytest.raises(ValueError, match="substeps"):
            Realisation(substeps=bad)
