"""Sampling-based MPC (engine/mpc.py): planner maths on a toy system, costs, adapters,
excitation, and short closed-loop rolling runs on MuJoCo (CI-sized)."""
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from tensegrity_engine import control as mpc
from tensegrity_engine.physics.config import load_robot
from tensegrity_engine.groundtruth.environments import contact_twin
from tensegrity_engine.physics.params import PhysicalParameters
from tensegrity_engine.physics.state import center_of_mass
from tensegrity_engine.physics.parameter_files import params_from_file


@pytest.fixture(scope="module", autouse=True)
def _threads():
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(old)


# ----------------------------------------------------------------------------- toy system
A_TOY = 3
LOW, HIGH = np.full(A_TOY, -1.0), np.full(A_TOY, 1.0)
TARGET = np.array([0.5, -0.3, 2.0])        # last one is out of bounds: optimum clips at 1


def toy_dynamics(state0, act0, plans):
    """'State' = the command itself in a [N, H, 1, 13] tensor (first A_TOY slots)."""
    N, H, A = plans.shape
    out = torch.zeros(N, H, 1, 13, dtype=plans.dtype)
    out[..., 0, :A] = plans
    return out


def toy_cost(states, plans, state0, prev):
    return ((states[..., 0, :A_TOY] - torch.as_tensor(TARGET, dtype=states.dtype)) ** 2).sum((-1, -2))


@pytest.mark.parametrize("name", ["rs", "cem", "mppi"])
def test_planners_improve_and_respect_bounds(name):
    cfg = mpc.PlannerConfig(horizon=4, num_samples=64, iterations=6, temperature=0.1, noise_scale=0.3)
    planner = mpc.make_planner(name, toy_dynamics, toy_cost, LOW, HIGH, cfg)
    s0, a0 = torch.zeros(1, 13), torch.zeros(A_TOY)
    start = float(toy_cost(toy_dynamics(s0, a0, planner.mean[None]), planner.mean[None], s0, a0))
    seen = []
    wrapped = planner.dynamics

    def spy(s, a, plans):
        seen.append(plans.clone())
        return wrapped(s, a, plans)

    planner.dynamics = spy
    plan = planner.plan(s0, a0)
    end = float(toy_cost(toy_dynamics(s0, a0, plan[None]), plan[None], s0, a0))
    assert plan.shape == (4, A_TOY)
    optimum = 4 * 1.0 ** 2                      # last command clipped at 1 on every knot
    assert end - optimum < (0.7 if name == "rs" else 0.1) * (start - optimum)
    every = torch.cat(seen)
    assert every.shape[0] == cfg.iterations * cfg.num_samples == planner.rollouts_evaluated
    assert (every >= -1.0 - 1e-6).all() and (every <= 1.0 + 1e-6).all()
    assert (plan >= -1.0).all() and (plan <= 1.0).all()
    if name != "rs":
        assert plan[:, 2].min() > 0.5            # pushed against the upper bound


@pytest.mark.parametrize("name", ["rs", "cem", "mppi"])
def test_a_model_whose_every_rollout_diverges_gives_no_plan(name):
    """Every rollout non-finite (a diverging model or state): every cost would be the same
    penalty and the plan the noise's mean, a finite command with nothing behind it; the
    planner says so instead (the controller holds the robot); one finite rollout suffices."""
    cfg = mpc.PlannerConfig(horizon=4, num_samples=16, iterations=2, temperature=0.1, noise_scale=0.3)

    def diverging(state0, act0, plans, keep=0):
        out = toy_dynamics(state0, act0, plans)
        out[keep:] = float("nan")
        return out
    planner = mpc.make_planner(name, diverging, toy_cost, LOW, HIGH, cfg)
    with pytest.raises(FloatingPointError, match="no rollout"):
        planner.plan(torch.zeros(1, 13), torch.zeros(A_TOY))
    planner = mpc.make_planner(name, lambda s, a, p: diverging(s, a, p, keep=1), toy_cost, LOW, HIGH, cfg)
    assert torch.isfinite(planner.plan(torch.zeros(1, 13), torch.zeros(A_TOY))).all()


def test_mppi_weights_and_temperature():
    """Low temperature -> nearly the best sample; high temperature -> nearly the mean of
    all samples (uniform weights)."""
    cfg = mpc.PlannerConfig(horizon=2, num_samples=32, iterations=1, noise_scale=0.3, target_ess=0.0)
    s0, a0 = torch.zeros(1, 13), torch.zeros(A_TOY)
    out = {}
    for lam in (1e-4, 1e4):
        cfg.temperature = lam
        planner = mpc.MPPI(toy_dynamics, toy_cost, LOW, HIGH, cfg)
        out[lam] = planner.plan(s0, a0)
        assert planner.last_info["effective_samples"][0] == pytest.approx(1.0 if lam < 1 else 32.0, rel=0.1)
    # replay the same noise (same seed) to find the best sample and the mean
    g = torch.Generator().manual_seed(cfg.seed)
    eps = 0.3 * 2.0 * torch.randn(32, 2, A_TOY, generator=g)
    eps[0] = 0.0
    plans = torch.clamp(eps, -1, 1)
    costs = toy_cost(toy_dynamics(s0, a0, plans), plans, s0, a0)
    torch.testing.assert_close(out[1e-4], plans[torch.argmin(costs)], atol=1e-4, rtol=0)
    torch.testing.assert_close(out[1e4], plans.mean(0), atol=1e-3, rtol=0)


def test_a_target_effective_sample_size_sets_the_temperature_from_the_costs():
    """`ess_temperature`: the weights have the asked share of the samples, whatever the
    costs' units, and a diverged sample (`BAD_COST`) does not move the temperature."""
    from tensegrity_engine.control.interfaces import BAD_COST
    from tensegrity_engine.control.planners import ess_temperature
    costs = torch.rand(40, generator=torch.Generator().manual_seed(3), dtype=torch.float64) ** 2
    excess = costs - costs.min()
    for share in (0.05, 0.2, 0.5):
        lam = ess_temperature(excess, share)
        w = torch.exp(-excess / lam)
        assert float(w.sum() ** 2 / (w * w).sum()) == pytest.approx(share * 40, rel=0.1)
        assert ess_temperature(1e3 * excess, share) == pytest.approx(1e3 * lam, rel=1e-9)
    bad = excess.clone()
    bad[7] = BAD_COST
    assert ess_temperature(bad, 0.2) == pytest.approx(ess_temperature(excess, 0.2), rel=0.1)
    assert ess_temperature(torch.zeros(8), 0.2) == 1.0          # all alike: uniform weights
    with pytest.raises(ValueError):
        ess_temperature(excess, 0.0)


def test_with_a_target_ess_the_plan_does_not_depend_on_the_costs_units():
    """A fixed temperature is in cost units: the same costs in other units give another
    plan. With ``target_ess`` the plan is the same."""
    s0, a0 = torch.zeros(1, 13), torch.zeros(A_TOY)

    def scaled(k):
        return lambda states, plans, state0, prev: k * toy_cost(states, plans, state0, prev)

    plans = {}
    for ess in (0.0, 0.2):
        cfg = mpc.PlannerConfig(horizon=2, num_samples=32, iterations=3, noise_scale=0.3, target_ess=ess)
        plans[ess] = [mpc.MPPI(toy_dynamics, scaled(k), LOW, HIGH, cfg).plan(s0, a0) for k in (1.0, 100.0)]
    assert (plans[0.0][0] - plans[0.0][1]).abs().max() > 0.05
    torch.testing.assert_close(plans[0.2][0], plans[0.2][1], atol=1e-5, rtol=0)


def test_warm_start_shift_and_reset():
    cfg = mpc.PlannerConfig(horizon=3, num_samples=8, iterations=1)
    planner = mpc.MPPI(toy_dynamics, toy_cost, LOW, HIGH, cfg)
    planner.reset(plan=torch.tensor([[0.1] * 3, [0.2] * 3, [5.0] * 3]))
    assert planner.mean[2, 0] == 1.0              # reset clips into the bounds
    planner.shift()
    torch.testing.assert_close(planner.mean[:, 0], torch.tensor([0.2, 1.0, 1.0]))
    planner.reset()
    torch.testing.assert_close(planner.mean, torch.zeros(3, A_TOY))   # centre of the range


# ----------------------------------------------------------------------------- cost
def test_locomotion_cost(three_bar):
    robot = three_bar
    cost = mpc.LocomotionCost(robot, target_velocity=(1.0, 0.0), control_dt=0.1, w_height=0.0,
                              w_smooth=0.0)
    s0 = torch.as_tensor(mpc.task_start(robot)[0])
    H = 5
    shift = torch.arange(1, H + 1, dtype=s0.dtype)[:, None, None] * 0.1
    good = s0.expand(H, -1, -1).clone()
    good[..., 0] += shift[..., 0]                 # +0.1 m per 0.1 s knot: exactly 1 m/s
    still = s0.expand(H, -1, -1).clone()
    back = good.clone()
    back[..., 0] -= 2 * shift[..., 0]
    nan = good.clone()
    nan[2, 0, 0] = float("nan")
    states = torch.stack([good, still, back, nan])
    plans = torch.zeros(4, H, robot.num_actuated, dtype=s0.dtype)
    c = cost(states, plans, s0, plans[0, 0])
    assert c[0] == pytest.approx(0.0, abs=1e-9)
    assert c[1] == pytest.approx(1.0, rel=1e-6)
    assert c[2] == pytest.approx(4.0, rel=1e-6)
    assert c[3] == mpc.BAD_COST
    # goal steering: desired velocity points at the goal, capped so as not to overshoot
    goal = mpc.LocomotionCost(robot, goal=(0.0, 1.0), speed=2.0, control_dt=0.1)
    v = goal.desired_velocity(torch.tensor([[0.0, 0.0, 0.5], [0.0, 0.95, 0.5]]))
    torch.testing.assert_close(v, torch.tensor([[0.0, 2.0], [0.0, 0.5]]), atol=1e-6, rtol=0)


# ----------------------------------------------------------------------------- adapters
def test_engine_and_mujoco_dynamics_agree_in_shape_and_start(three_bar):
    robot = three_bar
    s0, a0 = mpc.task_start(robot)
    plans = torch.as_tensor(np.random.default_rng(0).uniform(robot.command_low, robot.command_high,
                                                             (3, 2, robot.num_actuated)), dtype=torch.float32)
    eng = mpc.EngineDynamics(robot, control_dt=0.05, compile=False)
    mj = mpc.MujocoDynamics(contact_twin(robot, nthread=1), control_dt=0.05)
    se, sm = eng(s0, a0, plans), mj(s0, a0, plans)
    assert se.shape == sm.shape == (3, 2, robot.num_rods, 13)
    assert se.dtype == sm.dtype == torch.float32
    m = robot.rod_mass
    ce, cm = center_of_mass(se.double().numpy(), m), center_of_mass(sm.double().numpy(), m)
    assert np.abs(ce - cm).max() < 0.05              # 0.1 s from rest: same physics, roughly
    coarse = mpc.EngineDynamics(robot, control_dt=0.05, dt=0.01, integrator="implicit", compile=False)
    assert coarse.substeps == 5 and coarse.engine.actuator_timing == "mean"
    assert torch.isfinite(coarse(s0, a0, plans)).all()
    with pytest.raises(ValueError):
        mpc.EngineDynamics(robot, control_dt=0.1, dt=0.03)


@pytest.mark.parametrize("backend", ["native", "torch"])
def test_a_model_with_a_dead_time_plans_with_the_command_in_force(three_bar, backend):
    """actuator_delay = 20 ms: the robot runs the command in force for 20 ms, then the plan
    20 ms late; the same as a model without delay given that sequence by hand."""
    robot = three_bar
    s0, a0 = mpc.task_start(robot)
    A = robot.num_actuated
    plans = torch.as_tensor(np.random.default_rng(1).uniform(robot.command_low, robot.command_high, (3, 2, A)))
    in_force = torch.as_tensor(robot.command_low + 0.25 * (robot.command_high - robot.command_low))
    kw = dict(control_dt=0.05, dtype=torch.float64, backend=backend, compile=False if backend == "torch" else None)
    late = mpc.EngineDynamics(robot, PhysicalParameters(robot, values={"actuator_delay": 0.02}), **kw)
    plain = mpc.EngineDynamics(robot, **kw)
    fine = plans.repeat_interleave(50, 1)
    by_hand = torch.cat([in_force.expand(3, 20, A), fine[:, :-20]], 1)
    want = plain.engine.rollout(s0.expand(3, -1, -1) if torch.is_tensor(s0) else torch.as_tensor(s0).expand(3, -1, -1),
                                torch.as_tensor(a0).expand(3, A), by_hand, robot.dt, record_every=50,
                                params=plain._p)[0]
    late.in_force = in_force
    got = late(s0, a0, plans)
    np.testing.assert_allclose(got.numpy(), want.numpy(), atol=1e-9)
    assert (got - plain(s0, a0, plans)).abs().max() > 1e-4          # the dead time matters


def test_compiled_rollouts_match_eager(three_bar):
    """The torch backend's default path (torch.compile'd engine step) gives the eager
    rollouts; engines are shared between adapters (one compile per step shape), parameters
    are not."""
    robot = three_bar
    s0, a0 = mpc.task_start(robot)
    plans = torch.as_tensor(np.random.default_rng(1).uniform(robot.command_low, robot.command_high,
                                                             (4, 2, robot.num_actuated)), dtype=torch.float32)
    fast = mpc.EngineDynamics(robot, control_dt=0.02, backend="torch")
    assert fast.compile
    slow = mpc.EngineDynamics(robot, control_dt=0.02, compile=False)
    assert slow.engine is fast.engine
    torch.testing.assert_close(fast(s0, a0, plans), slow(s0, a0, plans), atol=2e-4, rtol=1e-4)
    heavy = PhysicalParameters(robot, values={"rod_mass": 20.0})
    slow.set_params(heavy)
    assert fast.params is not heavy and slow.params is heavy
    assert (fast(s0, a0, plans) - slow(s0, a0, plans)).abs().max() > 1e-4


def test_set_goal(three_bar):
    ctrl = mpc.MPPIController(three_bar, config=mpc.PlannerConfig(horizon=2, num_samples=4, iterations=1),
                              compile=False)
    ctrl.set_goal((0.0, -0.5))
    np.testing.assert_allclose(ctrl.cost.target_velocity, [0.0, -0.5])
    assert ctrl.cost.speed == pytest.approx(0.5) and ctrl.cost.goal is None
    v = ctrl.cost.desired_velocity(torch.zeros(1, 3))
    torch.testing.assert_close(v, torch.tensor([[0.0, -0.5]]))
    ctrl.set_goal(goal=(1.0, 0.0))
    v = ctrl.cost.desired_velocity(torch.zeros(1, 3))
    torch.testing.assert_close(v, torch.tensor([[0.5, 0.0]]))


def test_set_params_swaps_the_model(three_bar, tmp_path):
    robot = three_bar
    s0, a0 = mpc.task_start(robot)
    plans = torch.as_tensor(np.broadcast_to(robot.command_low, (1, 2, robot.num_actuated)).copy(),
                            dtype=torch.float32)
    ctrl = mpc.MPPIController(robot, config=mpc.PlannerConfig(horizon=2, control_dt=0.05,
                                                              num_samples=4, iterations=1),
                              compile=False)
    before = ctrl.dynamics(s0, a0, plans)
    heavy = PhysicalParameters(robot, values={"rod_mass": 20.0, "actuator_time_constant": 0.5})
    ctrl.set_params(heavy)
    after = ctrl.dynamics(s0, a0, plans)
    assert (before - after).abs().max() > 1e-3
    # the same values through a parameter file (mapping format) and a robot YAML
    import yaml
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump({"parameters": heavy.as_dict()}))
    loaded = params_from_file(robot, path)
    for k, v in heavy.as_dict().items():
        np.testing.assert_allclose(loaded.as_dict()[k], v, rtol=1e-6)
    try:
        from tensegrity_engine.physics.config import robot_to_yaml
    except ImportError:
        return
    path2 = tmp_path / "robot.yaml"
    path2.write_text(robot_to_yaml(heavy.to_robot_config()))
    loaded = params_from_file(robot, path2)
    np.testing.assert_allclose(loaded.as_dict()["rod_mass"], 20.0, rtol=1e-6)


# ----------------------------------------------------------------------------- excitation
@pytest.mark.parametrize("kind", ["multisine", "chirp"])
def test_excitation_policy(superball, kind):
    pol = mpc.ExcitationPolicy(superball, seed=3, kind=kind, control_dt=0.1)
    u = np.stack([pol.plan(None, None) for _ in range(50)])
    assert u.shape == (50, superball.num_actuated)
    assert (u >= superball.command_low).all() and (u <= superball.command_high).all()
    width = superball.command_high - superball.command_low
    assert (np.ptp(u, axis=0) > 0.3 * width).all()           # informative: wide excursions
    fine = pol.commands(5000, 0.001)
    assert np.abs(np.diff(fine, axis=0)).max() < 0.02 * width.max()   # smooth at 1 kHz
    pol.reset()
    np.testing.assert_array_equal(pol.plan(None, None), u[0])  # reset: deterministic
    other = mpc.ExcitationPolicy(superball, seed=4, kind=kind)
    assert not np.allclose(other.command_at(1.0), pol.command_at(1.0))


@pytest.mark.parametrize("band", [(0.2, 2.0), (0.5, 0.5)])
def test_a_chirp_sweeps_up_and_down_within_its_band_for_as_long_as_it_runs(superball, band):
    """The sweep turns at f_max and comes back (a sweep that kept rising left the 10 Hz
    command stream's band within seconds and overflowed to NaN after some 25 min), its phase
    continuous at every turn; a band of one frequency is a sine, not 0 / 0."""
    pol = mpc.ExcitationPolicy(superball, seed=3, kind="chirp", freq_range=band, duration=5.0)
    dt = 1e-3
    for start in (0.0, 4.5, 9.5, 3000.0):                     # a rise, both turns, an hour on
        t = start + np.arange(2000) * dt
        phase = pol._chirp_phase(t)
        assert np.isfinite(phase).all()
        freq = np.diff(phase) / (2 * np.pi * dt)
        assert (freq > band[0] * (1 - 1e-3)).all() and (freq < band[1] * (1 + 1e-3)).all(), (start, freq.min(), freq.max())
        u = pol.command_at(t)
        assert np.isfinite(u).all() and (u >= superball.command_low).all() and (u <= superball.command_high).all()
    with pytest.raises(ValueError, match="duration"):
        mpc.ExcitationPolicy(superball, kind="chirp", duration=0.0)


def test_step_excitation_holds_and_jumps(superball):
    """``steps``: every cable holds a level for 0.25-2.5 s (f 0.2-2 Hz), then jumps across
    the band; inside the command range; deterministic per seed, and each cable repeats after
    a whole number of holds (no short hold where the schedule wraps)."""
    from tensegrity_engine.control.excitation import STEPS_PERIOD
    pol = mpc.ExcitationPolicy(superball, seed=3, kind="steps", amplitude=0.8)
    assert (pol.period >= STEPS_PERIOD).all() and len(np.unique(pol.period)) > 1
    dt = 0.001
    width = superball.command_high - superball.command_low
    for start in (0.0, float(pol.period.min()) - 30.0):      # the first minute, and one across the wraps
        u = pol.command_at(start + np.arange(90_000) * dt)
        assert (u >= superball.command_low).all() and (u <= superball.command_high).all()
        for a in range(u.shape[1]):
            jumps = np.flatnonzero(np.abs(np.diff(u[:, a])) > 0)
            holds = np.diff(jumps) * dt
            assert len(jumps) >= 90 / 2.5 - 1 and holds.min() >= 0.25 - 2 * dt and holds.max() <= 2.5 + 2 * dt
            assert np.ptp(u[:, a]) > 0.5 * 0.8 * width[a]    # levels spread over the band
        assert np.abs(np.diff(u, axis=0)).max() > 0.2 * width.max()   # real steps, not a ramp
    a = int(np.argmin(pol.period))
    assert pol.command_at(12.345)[a] == pol.command_at(12.345 + pol.period[a])[a]
    planned = np.stack([pol.plan(None, None) for _ in range(30)])
    pol.reset()
    np.testing.assert_array_equal(np.stack([pol.plan(None, None) for _ in range(30)]), planned)
    np.testing.assert_array_equal(mpc.ExcitationPolicy(superball, seed=3, kind="steps").commands(100, 0.1),
                                  pol.commands(100, 0.1))
    assert not np.allclose(mpc.ExcitationPolicy(superball, seed=4, kind="steps").commands(100, 0.1), pol.commands(100, 0.1))
    with pytest.raises(ValueError, match="f_min <= f_max"):
        mpc.ExcitationPolicy(superball, kind="steps", freq_range=(2.0, 0.2))


def test_planning_data_points_paper():
    cfg = mpc.PlannerConfig(horizon=10, num_samples=40, iterations=5)
    assert mpc.planning_data_points(cfg, 50) == 100_000     # paper IV-C2


# ----------------------------------------------------------------------------- closed loop
@pytest.mark.parametrize("name,steps", [("three_bar", 6), ("superball", 5)])
def test_short_rolling_run_moves_forward(name, steps):
    """CI-sized version of the task: MPPI on the (nominal) engine, executed on MuJoCo,
    must move the CoM along +x."""
    robot = load_robot(name)
    cfg = mpc.PlannerConfig(horizon=3, num_samples=12, iterations=1, seed=1)
    ctrl = mpc.MPPIController(robot, config=cfg, compile=False)
    s0, a0 = mpc.task_start(robot)
    twin = contact_twin(robot, nthread=1)
    traj = mpc.run_closed_loop(ctrl, twin, s0, a0, num_steps=steps, control_dt=0.1)
    m = mpc.summarize(robot, traj, goal=(5.0, 0.0))
    assert traj["commands"].shape == (steps, robot.num_actuated)
    assert (traj["commands"] >= robot.command_low - 1e-9).all()
    assert (traj["commands"] <= robot.command_high + 1e-9).all()
    dx = m["final_xy"][0]
    assert dx > 0.1, m["final_xy"]
    assert dx > 2 * abs(m["final_xy"][1])
    assert len(ctrl.plan_times) == steps


@pytest.mark.parametrize("control_dt,record_dt", [(0.1004, 0.01), (0.1, 0.0104), (0.1, 0.03), (0.1, 0.0)])
def test_a_closed_loop_whose_periods_are_not_whole_steps_is_refused(three_bar, control_dt, record_dt):
    """A control or record period the twin's step does not tile (0.1004 s stepped as 0.100,
    every velocity 0.4 % off; records every 0.0104 s stamped so but 0.010 apart), or a record
    period that does not divide the control period, is a clear error before the run."""
    with pytest.raises(ValueError, match="multiples of robot.dt"):
        mpc.run_closed_loop(None, SimpleNamespace(robot=three_bar), None, None, control_dt=control_dt,
                            record_dt=record_dt)


def test_plan_on_mujoco_and_rs_cem(three_bar):
    """The same planners run on mujoco.rollout (ground truth baseline)."""
    robot = three_bar
    s0, a0 = mpc.task_start(robot)
    dyn = mpc.MujocoDynamics(contact_twin(robot, nthread=1))
    for name in ("rs", "cem", "mppi"):
        ctrl = mpc.MPPIController(robot, dynamics=dyn, planner=name,
                                  config=mpc.PlannerConfig(horizon=2, num_samples=8, iterations=2))
        u = ctrl.plan(s0, a0)
        assert u.shape == (robot.num_actuated,)
        assert (u >= robot.command_low).all() and (u <= robot.command_high).all()
        assert ctrl.current_plan.shape == (2, robot.num_actuated)
        with pytest.raises(TypeError):
            ctrl.set_params(PhysicalParameters(robot))


def test_the_planner_steps_a_stiff_model_as_identification_does(superball):
    """A model past the config's step (1.4x the cable damping) plans at the sub-step it needs
    (`stable_substeps`, as identification rolls it out), and a swap back restores 1 ms."""
    damped = PhysicalParameters(superball, {"cable_damping": 1.4 * superball.cable_damping.mean()})
    dyn = mpc.EngineDynamics(superball, damped, control_dt=0.1)
    assert dyn.dt == pytest.approx(superball.dt / 2) and dyn.substeps == 200
    s0, a0 = mpc.task_start(superball)
    plans = torch.as_tensor(np.random.default_rng(2).uniform(superball.command_low, superball.command_high,
                                                             (4, 5, superball.num_actuated)), dtype=torch.float32)
    states = dyn(s0, a0, plans)
    assert torch.isfinite(states).all() and states[..., 7:10].norm(dim=-1).max() < 5.0
    dyn.set_params(PhysicalParameters(superball))
    assert dyn.dt == superball.dt and dyn.substeps == 100


def test_the_airborne_term_charges_a_robot_off_the_floor_and_only_then(superball):
    s0, a0 = mpc.task_start(superball)
    states = torch.as_tensor(s0)[None, None].repeat(2, 4, 1, 1).clone()
    states[1, 1:, :, 2] += 0.1                       # knots 1..3 with the robot 10 cm up
    plans = torch.as_tensor(a0)[None, None].repeat(2, 4, 1)
    plain = mpc.LocomotionCost(superball, target_velocity=(0.0, 0.0))(states, plans, s0, a0)
    gentle = mpc.LocomotionCost(superball, target_velocity=(0.0, 0.0), w_airborne=10.0)(states, plans, s0, a0)
    assert gentle[0] == pytest.approx(float(plain[0]))            # on the floor: no charge
    lowest = mpc.LocomotionCost(superball).lowest_point(states[1])
    assert float(lowest[0]) == pytest.approx(0.0, abs=1e-3) and float(lowest[1]) == pytest.approx(0.1, abs=1e-3)
    assert float(gentle[1] - plain[1]) == pytest.approx(10.0 * 3 / 4 * (0.1 - 0.01), rel=0.02)
