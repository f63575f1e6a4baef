"""Task costs with the signature of `interfaces.Cost`."""
from __future__ import annotations

from typing import Optional, Sequence

import numpy as np
import torch

from tensegrity_engine.control.interfaces import BAD_COST, as_tensor
from tensegrity_engine.physics.config import RobotConfig
from tensegrity_engine.physics.state import POS


def com_xy(states: torch.Tensor, mass: torch.Tensor) -> torch.Tensor:
    w = mass / mass.sum()
    return (states[..., POS] * w[:, None]).sum(-2)


class LocomotionCost:
    """Track a desired CoM velocity over the horizon (robot-agnostic).

    Per knot k the achieved CoM velocity is the displacement over the knot divided by
    ``control_dt`` (robust to the CoM bobbing of a rolling polyhedron). Desired velocity:
    ``target_velocity`` (x, y), or, when ``goal`` (x, y) is given, ``speed`` towards the
    goal from the CoM at the start of the knot, capped at distance / ``approach_time``
    (default one knot: do not overshoot within it; longer: slow down to stop there).
    Cost per rollout, averaged over knots::

        |v_xy - v_des|^2 + w_height (z_k - z_0)^2 + w_smooth |u_k - u_{k-1}|^2 / width^2
            + w_airborne max(0, lowest_k - clearance)

    with ``u_{-1}`` the command being applied and ``lowest_k`` the lowest capsule point
    above the floor at the end of knot k: a robot in the air lands on its motors, so
    ``w_airborne`` (per metre, default 0: the paper's cost) trades speed for staying down.
    NaN rollouts cost `BAD_COST`.
    """

    def __init__(self, robot: RobotConfig, *, target_velocity: Sequence[float] = (1.0, 0.0),
                 goal: Optional[Sequence[float]] = None, speed: Optional[float] = None,
                 control_dt: float = 0.1, w_height: float = 0.1, w_smooth: float = 0.002,
                 terminal_weight: float = 1.0, approach_time: Optional[float] = None,
                 w_airborne: float = 0.0, clearance: float = 0.01):
        self.robot = robot
        self.target_velocity = np.asarray(target_velocity, dtype=np.float64)[:2]
        self.goal = None if goal is None else np.asarray(goal, dtype=np.float64)[:2]
        self.speed = float(np.linalg.norm(self.target_velocity) if speed is None else speed)
        self.control_dt = float(control_dt)
        # Near the goal the desired speed is distance / approach_time: one knot (the default)
        # arrives as fast as possible; a second or so slows down early enough to stop there.
        self.approach_time = float(control_dt if approach_time is None else approach_time)
        if not self.approach_time > 0:
            raise ValueError("approach_time must be > 0")
        self.w_height = float(w_height)
        self.w_smooth = float(w_smooth)
        self.terminal_weight = float(terminal_weight)
        self.w_airborne, self.clearance = float(w_airborne), float(clearance)
        self._mass = torch.as_tensor(robot.rod_mass)
        self._half = torch.as_tensor(0.5 * robot.rod_length)
        self._radius = torch.as_tensor(robot.rod_radius)
        self._width = torch.as_tensor(robot.command_high - robot.command_low)

    def set_goal(self, velocity=None, *, goal=None) -> None:
        """Track ``velocity`` (x, y) m/s (speed = its norm; goal steering off), or, with
        ``goal`` (x, y), head for that point at ``speed`` (or at |velocity| if given)."""
        if velocity is not None:
            self.target_velocity = np.asarray(velocity, dtype=np.float64)[:2]
            self.speed = float(np.linalg.norm(self.target_velocity))
        self.goal = None if goal is None else np.asarray(goal, dtype=np.float64)[:2]

    def lowest_point(self, states: torch.Tensor) -> torch.Tensor:
        """[...] height of the lowest capsule point above the floor for states [..., R, 13]."""
        from tensegrity_engine.physics.state import QUAT, quat_rotate

        dtype, device = states.dtype, states.device
        up = torch.tensor([0.0, 0.0, 1.0], dtype=dtype, device=device)
        axis_z = quat_rotate(states[..., QUAT], up.expand(states.shape[:-1] + (3,)))[..., 2]
        lowest = (states[..., 2] - self._half.to(dtype=dtype, device=device) * axis_z.abs()
                  - self._radius.to(dtype=dtype, device=device))
        return lowest.min(-1).values - self.robot.contact.ground_height

    def desired_velocity(self, com: torch.Tensor) -> torch.Tensor:
        """[..., 2] desired CoM velocity at CoM positions com [..., >=2]."""
        if self.goal is None:
            return torch.as_tensor(self.target_velocity, dtype=com.dtype,
                                   device=com.device).expand(*com.shape[:-1], 2)
        to_goal = torch.as_tensor(self.goal, dtype=com.dtype, device=com.device) - com[..., :2]
        dist = torch.linalg.vector_norm(to_goal, dim=-1, keepdim=True)
        speed = torch.clamp(dist / self.approach_time, max=self.speed)
        return to_goal / dist.clamp_min(1e-6) * speed

    def __call__(self, states: torch.Tensor, plans: torch.Tensor, state0, prev_command) -> torch.Tensor:
        dtype, device = states.dtype, states.device
        mass = self._mass.to(dtype=dtype, device=device)
        s0 = as_tensor(state0, dtype, device)
        com0 = com_xy(s0, mass)                                  # [3]
        com = com_xy(states, mass)                               # [N, H, 3]
        prev = torch.cat([com0.expand(com.shape[0], 1, 3), com[:, :-1]], 1)
        vel = (com[..., :2] - prev[..., :2]) / self.control_dt   # [N, H, 2]
        v_des = self.desired_velocity(prev)
        H = com.shape[1]
        weights = torch.ones(H, dtype=dtype, device=device)
        weights[-1] = self.terminal_weight
        track = (((vel - v_des) ** 2).sum(-1) * weights).sum(-1) / weights.sum()
        height = ((com[..., 2] - com0[2]) ** 2).mean(-1)
        width = self._width.to(dtype=dtype, device=device)
        u_prev = as_tensor(prev_command, dtype, device).expand(plans.shape[0], 1, -1)
        du = torch.diff(torch.cat([u_prev, plans], 1), dim=1) / width
        smooth = (du ** 2).sum(-1).mean(-1)
        cost = track + self.w_height * height + self.w_smooth * smooth
        if self.w_airborne:
            cost = cost + self.w_airborne * torch.relu(self.lowest_point(states) - self.clearance).mean(-1)
        return torch.where(torch.isfinite(cost), cost, torch.full_like(cost, BAD_COST))
