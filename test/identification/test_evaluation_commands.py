"""k-step-ahead evaluation runs each model's actuator as the model has it (delay, rate limit)."""
import numpy as np
import torch

from tensegrity_engine.identification.dataset import Trajectory
from tensegrity_engine.identification.evaluation import evaluate, horizon_errors, model_commands
from tensegrity_engine.physics.engine import TensegrityEngine
from tensegrity_engine.physics.params import PhysicalParameters
from tensegrity_engine.physics.state import initial_rod_state


def _robot_run(robot, params, seconds=1.6, seed=0):
    """The engine itself, hanging from rod 0 (a free body's CoM ignores its cables), under
    commands switched every 0.1 s; the commands reach
    the winches ``actuator_delay`` late (a whole number of steps here, shifted by hand)."""
    rng = np.random.default_rng(seed)
    dt, A = robot.dt, robot.num_actuated
    steps = int(round(seconds / dt))
    rest = robot.cable_rest_length[robot.actuated_indices]
    switches = rest + rng.uniform(-0.15, 0.05, (int(seconds / 0.1), A))
    cmd = np.repeat(switches, int(round(0.1 / dt)), 0)[:steps]
    lag = int(round(float(params.as_dict()["actuator_delay"][0]) / dt))
    acting = np.concatenate([np.repeat(cmd[:1], lag, 0), cmd[:steps - lag]])
    engine = TensegrityEngine(robot, params, fixed_rods=(0,), floor=False)
    x0 = torch.as_tensor(initial_rod_state(robot))[None]
    act0 = torch.as_tensor(rest)[None]
    with torch.no_grad():
        states, _ = engine.rollout(x0, act0, torch.as_tensor(acting)[None], dt, record_every=10,
                                   params=engine.param_values(torch.float64, "cpu"))
    s = np.concatenate([x0.numpy()[:, None], states.numpy()], 1)[0]
    t = np.arange(s.shape[0]) * 10 * dt
    return Trajectory(robot=robot, t=t, position=s[..., 0:3], quaternion=s[..., 3:7],
                      command_time=np.arange(steps) * dt, command=cmd, linear_velocity=s[..., 7:10],
                      angular_velocity=s[..., 10:13], act0=rest.copy(),
                      environment={"name": "hanging", "floor": False, "fixed_rods": [0]})


def test_a_late_slow_winch_model_predicts_its_own_motion_exactly(superball):
    """A model with a 30 ms command delay and winches limited to 0.05 m/s, scored on its own
    motion: k-step-ahead errors at round-off, because each restart takes the model's own
    (rate-limited) filter state and its commands as they act. A plain filter of the
    undelayed commands (what the evaluation used to do) is millimetres off."""
    params = PhysicalParameters(superball)
    params.set_value("actuator_delay", np.array([0.03]))
    params.set_value("actuator_max_speed", np.array([0.05]))
    traj = _robot_run(superball, params)
    acts, acting = model_commands(params, traj, int(round((traj.t[-1] - traj.t[0]) / superball.dt)))
    assert np.abs(np.diff(acts, axis=0)).max() <= 0.05 * superball.dt * (1 + 1e-9)     # the limit binds
    assert np.abs(np.diff(acts, axis=0)).max() >= 0.05 * superball.dt * (1 - 1e-6)
    e = horizon_errors(params, [traj], (0.1, 0.5), stride=0.3)
    assert e["windows"] >= 3
    assert max(float(np.max(e[h])) for h in (0.1, 0.5)) < 1e-9
    # open loop over the whole run too (the engine filters; the commands must come late)
    assert float(np.max(evaluate(params, [traj])["com_error"])) < 1e-9
    undelayed = PhysicalParameters(superball)
    undelayed.set_value("actuator_max_speed", np.array([0.05]))
    assert float(np.max(evaluate(undelayed, [traj])["com_error"])) > 1e-4
    # the same robot judged with an instant, undelayed winch model is visibly off
    plain = PhysicalParameters(superball)
    e_plain = horizon_errors(plain, [traj], (0.1, 0.5), stride=0.3)
    assert float(np.mean(e_plain[0.5])) > 1e-3


def test_model_commands_equal_the_chained_filter_steps(superball):
    """`model_commands` evaluates each stretch of one command in closed form; chaining the
    filter step by step (as the objective and the planner run it) gives the same states, with
    the speed limit binding on some stretches and not on others, and a fractional delay's
    blended step between stretches."""
    from tensegrity_engine.physics.actuators import actuator_update, delayed_commands
    params = PhysicalParameters(superball)
    params.set_value("actuator_delay", np.array([0.0234]))
    params.set_value("actuator_max_speed", np.array([0.3]))
    traj = _robot_run(superball, params, seconds=0.8, seed=3)
    steps = int(round((traj.t[-1] - traj.t[0]) / superball.dt))
    acts, acting = model_commands(params, traj, steps)
    v = {k: torch.as_tensor(np.asarray(x, dtype=np.float64)) for k, x in params.as_dict().items()}
    cmd = np.clip(traj.command_grid(traj.t[0], steps, superball.dt), superball.command_low, superball.command_high)
    chained_acting = delayed_commands(torch.as_tensor(cmd), v["actuator_delay"], superball.dt)
    a = torch.as_tensor(traj.initial_act(), dtype=torch.float64)
    chained = [a]
    for k in range(steps):
        a = actuator_update(a, chained_acting[k], v["actuator_time_constant"], superball.dt,
                            v["actuator_max_speed"])[0]
        chained.append(a)
    chained = torch.stack(chained).numpy()
    assert np.array_equal(acting, chained_acting.numpy())
    rate = np.abs(np.diff(acts, axis=0)) / superball.dt
    assert rate.max() >= 0.3 * (1 - 1e-6)                          # the limit binds somewhere
    assert (rate < 0.3 * 0.5).mean() > 0.2                          # and is off elsewhere
    blended = ~np.isin(acting, cmd).all(-1)
    assert blended.any()                                            # the delay's blended steps
    assert np.abs(acts - chained).max() < 1e-12
