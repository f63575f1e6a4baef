"""Closed-loop execution of a policy on the MuJoCo twin and the task metrics."""
from __future__ import annotations

import time
from typing import Callable, Optional

import numpy as np

from tensegrity_engine.control.planners import PlannerConfig
from tensegrity_engine.physics.config import RobotConfig


def task_start(robot: RobotConfig, start_xy=(0.0, 0.0)) -> tuple[np.ndarray, np.ndarray]:
    """(rod_state [R, 13], act [A]): the robot at rest on the floor with its CoM above
    ``start_xy``."""
    from tensegrity_engine.groundtruth.environments import rest_pose
    from tensegrity_engine.physics.state import center_of_mass

    rs, act = rest_pose(robot)
    com = center_of_mass(rs, robot.rod_mass)
    rs[:, 0:2] += np.asarray(start_xy, dtype=np.float64) - com[:2]
    return rs, act


def run_closed_loop(policy, twin, state0, act0, *, num_steps: int = 50, control_dt: float = 0.1,
                    record_dt: float = 0.01, progress: Optional[Callable[[int, dict], None]] = None) -> dict:
    """Execute ``policy.plan(rod_state, act) -> command`` on the MuJoCo twin, replanning
    every ``control_dt`` from the twin's state. Returns a dict of numpy arrays: ``t``
    [T], ``states`` [T, R, 13] every ``record_dt`` (t = 0 included), ``commands``
    [num_steps, A], ``plan_time`` [num_steps] (s)."""
    robot = twin.robot
    per_ctrl = int(round(control_dt / robot.dt))
    per_rec = int(round(record_dt / robot.dt))
    if (per_ctrl < 1 or per_rec < 1 or abs(per_ctrl * robot.dt - control_dt) > 1e-9
            or abs(per_rec * robot.dt - record_dt) > 1e-9 or per_ctrl % per_rec):
        raise ValueError(f"record_dt ({record_dt:g} s) must divide control_dt ({control_dt:g} s), and both be "
                         f"multiples of robot.dt ({robot.dt:g} s)")
    twin.reset(state0, act0)
    states, times, commands, plan_time = [twin.get_state()[0]], [0.0], [], []
    for k in range(num_steps):
        rs, act = twin.get_state()
        t0 = time.perf_counter()
        u = np.asarray(policy.plan(rs, act), dtype=np.float64)
        plan_time.append(time.perf_counter() - t0)
        commands.append(u)
        for j in range(per_ctrl // per_rec):
            twin.step(u, nsteps=per_rec)
            states.append(twin.get_state()[0])
            times.append(times[-1] + record_dt)
        if progress is not None:
            progress(k, {"state": states[-1], "plan_time": plan_time[-1]})
    return {"t": np.array(times), "states": np.array(states), "commands": np.array(commands),
            "plan_time": np.array(plan_time), "control_dt": control_dt}


def summarize(robot: RobotConfig, traj: dict, goal=(5.0, 0.0)) -> dict:
    """Task metrics of a closed-loop run: mean x velocity (displacement / duration),
    final CoM xy, distance to ``goal``, per-control-step CoM velocity [K, 2]."""
    from tensegrity_engine.physics.state import center_of_mass

    com = center_of_mass(traj["states"], robot.rod_mass)
    t = traj["t"]
    per = int(round(traj["control_dt"] / (t[1] - t[0])))
    knots = com[::per]
    vel = np.diff(knots[:, :2], axis=0) / traj["control_dt"]
    duration = t[-1] - t[0]
    return {
        "com": com,
        "knot_t": t[::per][1:],
        "knot_velocity": vel,
        "mean_vx": float((com[-1, 0] - com[0, 0]) / duration),
        "final_xy": com[-1, :2].copy(),
        "distance": float(np.linalg.norm(com[-1, :2] - np.asarray(goal, dtype=np.float64))),
        "plan_time_mean": float(np.mean(traj["plan_time"])),
    }


def planning_data_points(config: PlannerConfig, num_control_steps: int, sample_interval: float = 0.1) -> int:
    """Ground-truth data points consumed by planning directly on the ground truth
    (paper IV-C2): steps x iterations x samples x horizon / sampling interval."""
    return int(round(num_control_steps * config.iterations * config.num_samples
                     * config.horizon_time / sample_interval))
