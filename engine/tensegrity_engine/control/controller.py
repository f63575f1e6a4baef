"""`MPPIController`: the stateful receding-horizon controller the ROS node and the
closed-loop runs use."""
from __future__ import annotations

import math
import time
from typing import Optional

import numpy as np
import torch

from tensegrity_engine.control.costs import LocomotionCost
from tensegrity_engine.control.dynamics import EngineDynamics
from tensegrity_engine.control.interfaces import Cost, Dynamics
from tensegrity_engine.control.planners import PlannerConfig, make_planner
from tensegrity_engine.physics.config import RobotConfig
from tensegrity_engine.physics.params import PhysicalParameters


class MPPIController:
    """Stateful receding-horizon controller (one call per ``control_dt``).

    ``plan(rod_state [R, 13], act [A]) -> command [A]`` (numpy float64, inside the command
    range): optimises from the measured state, returns the plan's first knot and shifts
    the plan for the next call (warm start). ``reset()`` forgets the plan.
    ``set_params(PhysicalParameters)`` swaps the engine model (engine dynamics only).

    Default: MPPI over the engine (`EngineDynamics`; ``backend``, ``compile`` and ``threads``
    are passed to it) with `LocomotionCost` (1 m/s along +x).
    Pass ``dynamics=MujocoDynamics(twin)`` to plan on MuJoCo, ``planner="cem"``/``"rs"``
    for the other planners.
    """

    def __init__(self, robot: RobotConfig, *, params: Optional[PhysicalParameters] = None,
                 dynamics: Optional[Dynamics] = None, cost: Optional[Cost] = None,
                 planner: str = "mppi", config: Optional[PlannerConfig] = None,
                 engine_dt: Optional[float] = None, integrator: Optional[str] = None,
                 device="cpu", dtype: torch.dtype = torch.float32, compile: Optional[bool] = None,
                 backend: Optional[str] = None, threads: int = 1):
        self.robot = robot
        self.config = config or PlannerConfig()
        if dynamics is None:
            dynamics = EngineDynamics(robot, params, control_dt=self.config.control_dt,
                                      dt=engine_dt, integrator=integrator, device=device, dtype=dtype,
                                      compile=compile, backend=backend, threads=threads)
        elif params is not None:
            raise ValueError("give either params (engine dynamics) or dynamics, not both")
        self.dynamics = dynamics
        self.cost = cost or LocomotionCost(robot, control_dt=self.config.control_dt)
        self.planner = make_planner(planner, dynamics, self.cost, robot.command_low,
                                    robot.command_high, self.config, device=device, dtype=dtype)
        self.last_plan_time = float("nan")
        self.plan_times: list[float] = []
        self.last_planned: Optional[torch.Tensor] = None     # [H, A] the newest plan, before its shift
        self._prev = None

    @property
    def control_dt(self) -> float:
        return self.config.control_dt

    def reset(self) -> None:
        self.planner.reset()
        self.plan_times = []
        self._prev = None

    def set_goal(self, velocity=None, *, goal=None) -> None:
        """New task for the cost (see `LocomotionCost.set_goal`); the warm start is kept."""
        self.cost.set_goal(velocity, goal=goal)

    def set_params(self, params: PhysicalParameters) -> None:
        if not hasattr(self.dynamics, "set_params"):
            raise TypeError(f"{type(self.dynamics).__name__} has no physical parameters to set")
        self.dynamics.set_params(params)

    @property
    def current_plan(self) -> np.ndarray:
        return self.planner.mean.detach().cpu().double().numpy()

    def plan(self, rod_state, act, budget: float = math.inf, in_force=None) -> np.ndarray:
        """The command for now from (rod_state, act). Anytime: iterations stop once
        ``budget`` s have passed (the first always completes). ``in_force``: the command the
        robot runs now, as sent (after a safety layer's limits, or an excitation's); by
        default the last one planned."""
        t0 = time.perf_counter()
        last = self._prev if in_force is None else np.asarray(in_force, dtype=np.float64)
        prev = act if last is None else last
        if hasattr(self.dynamics, "in_force"):        # what a model's dead time keeps running
            self.dynamics.in_force = last
        plan = self.planner.plan(rod_state, act, prev, deadline=t0 + budget)
        self.last_planned = plan.detach().clone()
        command = plan[0].detach().cpu().double().numpy()
        self.planner.shift()
        self._prev = command
        self.last_plan_time = time.perf_counter() - t0
        self.plan_times.append(self.last_plan_time)
        return command

    __call__ = plan

    @torch.no_grad()
    def planned_path(self, rod_state, act) -> Optional[np.ndarray]:
        """[H + 1, 3] the centre of mass along the newest plan from (rod_state, act), as the
        planning model predicts it (None before the first plan); for display."""
        if self.last_planned is None:
            return None
        from tensegrity_engine.physics.state import center_of_mass

        states = self.dynamics(rod_state, act, self.last_planned[None])[0].detach().cpu().double().numpy()
        path = np.concatenate([np.asarray(rod_state, dtype=np.float64)[None], states])
        return np.stack([center_of_mass(s, self.robot.rod_mass) for s in path])

    @torch.no_grad()
    def model_tensions(self, rod_state, act) -> Optional[np.ndarray]:
        """[C] cable tensions (N) the planning model gives the state (None: no engine model)."""
        engine = getattr(self.dynamics, "engine", None)
        params = getattr(self.dynamics, "_p", None)
        if engine is None or params is None:
            return None
        device = self.dynamics.device
        p = {k: v.to(torch.float64) for k, v in params.items()}
        s = torch.as_tensor(np.asarray(rod_state, dtype=np.float64), device=device)[None]
        a = torch.as_tensor(np.asarray(act, dtype=np.float64), device=device)[None]
        return engine.cable_tensions(s, a, p)[0].cpu().numpy()
