"""Sampling-based model-predictive control over batched rollouts (paper Section IV-C).

Pieces (all ROS-free, float32 and gradient-free by default, any torch device):

* **Dynamics adapters** -- callables ``dynamics(state0 [R, 13], act0 [A], plans [N, H, A])
  -> states [N, H, R, 13]``: the rod state at the end of each of the H control intervals
  ("knots", ``control_dt`` long, command held over each) for N candidate plans.
  `EngineDynamics` runs the differentiable engine (`physics.engine.TensegrityEngine`) at a
  configurable planning step and integrator (by default the semi-implicit step in the
  fused C kernel of `tensegrity_engine.physics.native`); `MujocoDynamics` runs ``mujoco.rollout``
  on the MuJoCo twin (the ground truth baseline). The same planner runs on either.
* **Costs** -- callables ``cost(states [N, H, R, 13], plans [N, H, A], state0, prev_command)
  -> [N]``. `LocomotionCost` tracks a desired CoM velocity (optionally steered at a goal)
  from the CoM displacement over each knot, with light penalties on CoM height
  excursions and command changes. Nothing in it is robot-specific: the CoM comes from
  the rod masses of the config.
* **Planners** -- `RandomShooting`, `CEM` and `MPPI` (subclasses of `SamplingPlanner`),
  warm-started from the shifted previous plan, commands clipped to the cable ranges.
* **Controllers** -- `MPPIController` (stateful: ``reset``, ``plan(rod_state, act) ->
  command [A]``, ``set_params``) for the ROS node and the closed-loop runs, and
  `ExcitationPolicy` (smooth random multi-sine commands, same interface) to collect
  informative identification data before a model exists.
* **Safety** (``safety``) -- `CommandLimits` (range and rate per the robot YAML) and
  `HoldLatch` (a latched hold on stale poses, a rejected model or an operator's request,
  cleared only by an explicit resume), for controllers on hardware.
* **Real time** (``latency``, ``realtime``) -- `CommandHistory` (the commands sent, as
  they act), `predict_at` (the model's state when a new command takes effect),
  `RealTimePlanner` (one command per tick, stamped valid-from, planned from that
  prediction within an anytime budget) and `TickSchedule`, for a robot that does not wait.
* `run_closed_loop` executes a policy on the MuJoCo twin (replanning every
  ``control_dt`` from MuJoCo's measured state) and `summarize` computes the task metrics.

Modules: ``interfaces`` (the dynamics and cost contracts), ``dynamics``, ``costs``,
``planners``, ``controller``, ``excitation``, ``execution``, ``safety``, ``latency``,
``realtime``. Imports physics and
groundtruth (rest poses for the task start), never identification or cli.
"""
from tensegrity_engine.control.controller import MPPIController
from tensegrity_engine.control.costs import LocomotionCost, com_xy
from tensegrity_engine.control.dynamics import EngineDynamics, MujocoDynamics
from tensegrity_engine.control.excitation import ExcitationPolicy
from tensegrity_engine.control.execution import planning_data_points, run_closed_loop, summarize, task_start
from tensegrity_engine.control.interfaces import BAD_COST
from tensegrity_engine.control.planners import (CEM, MPPI, PLANNERS, PlannerConfig, RandomShooting,
                                                SamplingPlanner, make_planner)
from tensegrity_engine.control.safety import CommandLimits, HoldLatch

__all__ = [
    "PlannerConfig", "EngineDynamics", "MujocoDynamics", "LocomotionCost",
    "SamplingPlanner", "RandomShooting", "CEM", "MPPI", "PLANNERS", "make_planner",
    "MPPIController", "ExcitationPolicy", "run_closed_loop", "summarize", "task_start",
    "com_xy", "planning_data_points", "BAD_COST", "CommandLimits", "HoldLatch",
]
