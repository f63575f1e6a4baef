"""Differentiable tensegrity engine (paper Section III, Fig. 2).

Pipeline of one step, all batched over any leading dimensions of the state:

  cable actuator    command -> rest length (first-order filter, gain/offset calibration)
  CFG               tension-only spring-dampers between rod end nodes
  DCC + CRG         capsule/ground and capsule/capsule contacts, penalty normal force,
                    smooth Coulomb friction (sliding, torsional, rolling)
  RAG               Newton-Euler accelerations of the rigid rods (gyroscopic term included)
  integrator        semi-implicit Euler, linearised backward Euler ("implicit"), ANI,
                    "implicitfast" (implicit per rod in cable damping and gyroscopic terms),
                    or "rk4" (four Runge-Kutta stages); a robot model says which of
                    semi-implicit / implicitfast / rk4 it steps with

Where each stage lives: `actuators` (cable actuator), `forces` (CFG, DCC + CRG, with the
force conventions) and `jacobians` (their linearisation), `rigid_body` (RAG),
`integrators` (the integrators, described there), all on the constant matrices of
`topology`; `rollouts` holds the rollout loops (gradient checkpointing included).
`TensegrityEngine` composes them behind one API (steps, rollouts, diagnostics).
"""
from __future__ import annotations

from typing import Callable, Optional

import torch
from torch import nn

from tensegrity_engine.physics import rollouts
from tensegrity_engine.physics.actuators import CableActuators
from tensegrity_engine.physics.config import RobotConfig
from tensegrity_engine.physics.forces import ForceModel, cables
from tensegrity_engine.physics.integrators import INTEGRATORS, make_integrators
from tensegrity_engine.physics.jacobians import force_jacobians
from tensegrity_engine.physics.params import PhysicalParameters
from tensegrity_engine.physics.rigid_body import RigidRods
from tensegrity_engine.physics.state import ANG_VEL, LIN_VEL, POS, QUAT
from tensegrity_engine.physics.topology import Topology
from tensegrity_engine.physics.vectors import cross


class TensegrityEngine(nn.Module):
    """Differentiable engine for one robot topology.

    state:   [..., R, 13] (see ``physics.state``), act: [..., A] filtered commands (m),
    command: [..., A] target rest lengths (m), wrench: [..., R, 6] external force and
    torque at each rod centre, world frame.  Any float dtype and device.

    Internally states are components-first, S [..., 13, R] (``*_soa`` names), and rods are
    axisymmetric capsules whose kinematics are small constant matmuls (see `topology`).
    ``params`` is the only submodule: ``.to()`` and ``state_dict`` cover the parameters;
    constants are cached per dtype and device.
    """

    def __init__(self, robot: RobotConfig, params: Optional[PhysicalParameters] = None, *,
                 fixed_rods=(), floor: bool = True, friction_smoothing: float = 0.01,
                 angular_smoothing: float = 0.05, ani_safety: float = 0.5,
                 actuator_timing: str = "start", ground_contact_fn: Optional[Callable] = None):
        super().__init__()
        self.robot = robot
        self.params = params if params is not None else PhysicalParameters(robot)
        # ground_contact_fn: optional external ground collision checker (see `ForceModel`).
        # actuator_timing: "start" or "mean" of the filter over a step (see `CableActuators`).
        self.topology = Topology(robot, fixed_rods)
        self.actuators = CableActuators(self.topology, actuator_timing)
        self.force_model = ForceModel(self.topology, floor=floor, friction_smoothing=friction_smoothing,
                                      angular_smoothing=angular_smoothing, ground_contact_fn=ground_contact_fn)
        self.rods = RigidRods(self.topology)
        self.integrators = make_integrators(self.force_model, self.rods, self.actuators, ani_safety=ani_safety)
        self._compiled_steps: dict = {}

    # ------------------------------------------------------------------ settings
    # Read-only views of the settings the parts own (a single source of truth).
    @property
    def num_rods(self) -> int:
        return self.robot.num_rods

    @property
    def num_pairs(self) -> int:
        return self.topology.num_pairs

    @property
    def fixed_rods(self) -> tuple[int, ...]:
        return self.topology.fixed_rods

    @property
    def floor(self) -> bool:
        return self.force_model.floor

    @property
    def friction_smoothing(self) -> float:
        return self.force_model.friction_smoothing

    @property
    def angular_smoothing(self) -> float:
        return self.force_model.angular_smoothing

    @property
    def ground_contact_fn(self) -> Optional[Callable]:
        return self.force_model.ground_contact_fn

    @property
    def native_kernel_applies(self) -> bool:
        """Whether the C kernel (`native`) can step this engine: its own floor (either
        contact law), not an external ground checker."""
        return self.ground_contact_fn is None

    @property
    def actuator_timing(self) -> str:
        return self.actuators.timing

    @property
    def ani_safety(self) -> float:
        return self.integrators["ani"].safety

    # ------------------------------------------------------------------ helpers
    def constants(self, dtype: torch.dtype, device) -> dict:
        """Topology constants as tensors of this dtype/device (cached: no per-step copies)."""
        return self.topology.constants(dtype, device)

    def param_values(self, dtype: torch.dtype, device) -> dict[str, torch.Tensor]:
        return {k: v.to(dtype=dtype, device=device) for k, v in self.params.values().items()}

    def initial_act(self, like: torch.Tensor) -> torch.Tensor:
        """Filtered commands that reproduce the config rest lengths (nominal calibration)."""
        return self.actuators.initial_act(like)

    def clamp_command(self, command: torch.Tensor) -> torch.Tensor:
        return self.actuators.clamp_command(command)

    def rest_lengths(self, act: torch.Tensor, p: dict) -> torch.Tensor:
        """[..., C] rest lengths from filtered commands [..., A]."""
        return self.actuators.rest_lengths(act, p)

    def rod_axes(self, state: torch.Tensor) -> torch.Tensor:
        k = self.constants(state.dtype, state.device)
        q = state[..., QUAT]
        return (q.unsqueeze(-1) * q.unsqueeze(-2)).flatten(-2) @ k["axis_form"]

    def end_nodes(self, state: torch.Tensor) -> torch.Tensor:
        """[..., R, 2, 3] end-node positions."""
        k = self.constants(state.dtype, state.device)
        Y = torch.cat([state[..., POS], self.rod_axes(state)], -2)
        return (k["N"] @ Y).unflatten(-2, (self.num_rods, 2))

    # ------------------------------------------------------------------ forces and dynamics
    def forces(self, state: torch.Tensor, rest: torch.Tensor, p: dict,
               wrench: Optional[torch.Tensor] = None, jacobians: bool = False) -> dict:
        """Net force and torque on every rod, world frame, rod-major ``[..., R, 3]``.

        With ``jacobians`` the dict also holds K, D [..., 6R, 6R] (PSD stiffness and
        damping of cable and contact forces w.r.t. rod displacements/velocities (v, w)).
        """
        out = self.force_model(state.transpose(-1, -2), rest, p,
                               None if wrench is None else wrench.transpose(-1, -2), keep=jacobians)
        result = {"force": out["force"].transpose(-1, -2), "torque": out["torque"].transpose(-1, -2),
                  "axis": out["axis"].transpose(-1, -2), "mass": out["mass"], "tension": out["tension"],
                  "inertia_factor": out["inertia_factor"]}
        if jacobians:
            result["K"], result["D"] = force_jacobians(self.topology, state, out, p)
        return result

    def accelerations(self, state, out):
        """Rod-major accelerations from a `forces` result: (a [..., R, 3], alpha [..., R, 3])."""
        soa = {"axis": out["axis"].transpose(-1, -2), "mass": out["mass"], "inertia_factor": out["inertia_factor"],
               "force": out["force"].transpose(-1, -2), "torque": out["torque"].transpose(-1, -2)}
        S = state.transpose(-1, -2)
        soa["axis_rate"] = cross(S[..., 10:13, :], soa["axis"])
        acc, alpha = self.rods.accelerations(S, soa)
        return acc.transpose(-1, -2), alpha.transpose(-1, -2)

    def stable_step(self, p: dict) -> float:
        """Largest semi-implicit step the current parameters allow (ANI's bound)."""
        return self.integrators["ani"].stable_step(p)

    # ------------------------------------------------------------------ stepping
    def _step_soa(self, S, act, command, dt, integrator, wrench, p):
        return self.integrators[integrator].step(S, act, self.clamp_command(command), dt, wrench, p)

    def _check_integrator(self, integrator: Optional[str]) -> str:
        """The integrator asked for, or the robot model's own (``engine.integrator``)."""
        integrator = self.robot.integrator if integrator is None else integrator
        if integrator not in INTEGRATORS:
            raise ValueError(f"integrator must be one of {INTEGRATORS}, got {integrator!r}")
        return integrator

    def step(self, state: torch.Tensor, act: torch.Tensor, command: torch.Tensor, dt: float, *,
             integrator: Optional[str] = None, wrench: Optional[torch.Tensor] = None,
             params: Optional[dict] = None):
        """Advance (state [..., R, 13], act [..., A]) by dt under a command held over the step
        (``integrator`` None: the robot model's)."""
        integrator = self._check_integrator(integrator)
        p = params if params is not None else self.param_values(state.dtype, state.device)
        S, act = self._step_soa(state.transpose(-1, -2), act, command, dt, integrator,
                                None if wrench is None else wrench.transpose(-1, -2), p)
        return S.transpose(-1, -2), act

    def _compiled_step(self, integrator: str):
        """torch.compile'd step for fast rollouts (MPC, benchmarks) and, with gradients, BPTT
        (AOTAutograd compiles the step's backward too).

        Eager torch pays ~2 us of dispatch per op and a step has ~350 small ops; inductor
        fuses them into a few loops (measured here: 2.8x faster at batch 40, 2.5x at
        1000; a training epoch 2.5x). One step is compiled, not the unrolled rollout: a
        100-step rollout compiled whole had not finished compiling after 14 min on the CPU,
        one step compiles in 27-60 s. Compiled once per integrator, dt, dtype, input shapes
        and grad state (with or without pushes, the first step's inputs apart); inductor's
        on-disk cache makes later processes start in seconds.
        """
        if integrator == "ani":
            raise ValueError("compile=True supports 'semi_implicit' and 'implicit' (ANI picks its "
                             "sub-step count at run time)")
        if integrator not in self._compiled_steps:
            def step_fn(S, act, command, dt, wrench, p):
                return self._step_soa(S, act, command, dt, integrator, wrench, p)
            self._compiled_steps[integrator] = torch.compile(step_fn, dynamic=False)
        return self._compiled_steps[integrator]

    def rollout(self, state: torch.Tensor, act: torch.Tensor, commands: torch.Tensor, dt: float, *,
                integrator: Optional[str] = None, wrenches: Optional[torch.Tensor] = None,
                record_every: int = 1, params: Optional[dict] = None, compile: bool = False,
                checkpoint_every: int = 0):
        """Run commands [..., S, A] (one per step of length dt) with ``integrator`` (None: the
        robot model's, ``engine.integrator``).

        Returns (states [..., S // record_every, R, 13], acts [..., S // record_every, A]),
        the state after steps record_every, 2 record_every, ...
        ``compile=True`` runs a torch.compile'd step (planning, benchmarks, and training: the
        gradient flows through the compiled step's compiled backward).
        ``checkpoint_every=k`` keeps only every k-th state for backward and recomputes the
        steps in between (BPTT memory O(S/k + k) instead of O(S)); it needs
        record_every to divide k.
        """
        integrator = self._check_integrator(integrator)
        if record_every < 1:
            raise ValueError("record_every must be >= 1")
        p = params if params is not None else self.param_values(state.dtype, state.device)

        def eager(S_, a_, c_, dt_, w_, p_):
            return self._step_soa(S_, a_, c_, dt_, integrator, w_, p_)

        if compile:
            if not torch.is_grad_enabled():
                p = {k: v.detach() for k, v in p.items()}
            step = self._compiled_step(integrator)
        else:
            step = eager
        S = state.transpose(-1, -2).contiguous() if compile else state.transpose(-1, -2)
        wr = None if wrenches is None else wrenches.transpose(-1, -2)      # [..., S, 6, R]
        if checkpoint_every and torch.is_grad_enabled():
            if compile:
                raise ValueError("checkpoint_every recomputes steps in eager torch: use it without compile=True")
            states, acts = rollouts.run_checkpointed(eager, S, act, commands, dt, wr, p, record_every,
                                                     checkpoint_every)
        elif compile:
            # one compilation per integrator, dt, dtype, input shapes and grad state: identification's
            # schedule has ~10 of them, past dynamo's default limit of 8 (then: eager)
            with torch._dynamo.config.patch(recompile_limit=64):
                states, acts = rollouts.run(step, S, act, commands, dt, wr, p, record_every)
        else:
            states, acts = rollouts.run(step, S, act, commands, dt, wr, p, record_every)
        return states.transpose(-1, -2), acts

    # ------------------------------------------------------------------ diagnostics
    def energy(self, state: torch.Tensor, act: torch.Tensor, params: Optional[dict] = None) -> torch.Tensor:
        """Total mechanical energy [...]: kinetic + gravity + cable + contact springs."""
        p = params if params is not None else self.param_values(state.dtype, state.device)
        k = self.constants(state.dtype, state.device)
        rest = self.rest_lengths(act, p)
        R = self.num_rods
        mass = p["rod_mass"].expand(R)
        axis = self.rod_axes(state)
        v, w = state[..., LIN_VEL], state[..., ANG_VEL]
        w_axial = torch.linalg.vecdot(axis, w)
        w_perp2 = torch.linalg.vecdot(w, w) - w_axial ** 2
        kinetic = 0.5 * (mass * torch.linalg.vecdot(v, v)).sum(-1) + 0.5 * (
            mass * (k["it"] * p["rod_inertia_factor"].expand(R) * w_perp2 + k["ia"] * w_axial ** 2)).sum(-1)
        gravity = -(mass.unsqueeze(-1) * k["gravity"] * state[..., POS]).sum((-1, -2))
        Y = torch.cat([state[..., POS], axis], -2)
        length = torch.linalg.vector_norm(k["W"] @ Y, dim=-1)
        cable = 0.5 * (p["cable_stiffness"] * torch.relu(length - rest) ** 2).sum(-1)
        total = kinetic + gravity + cable
        if self.floor and not self.force_model.soft_ground:     # the soft law stores no energy
            z = (k["N"] @ Y)[..., 2]
            depth = k["node_radius"] - (z - self.robot.contact.ground_height)
            total = total + 0.5 * (p["contact_stiffness"] * torch.relu(depth) ** 2).sum(-1)
        return total

    def cable_tensions(self, state, act, params: Optional[dict] = None) -> torch.Tensor:
        """[..., C] cable tensions (N) of states [..., R, 13] with actuator states [..., A]:
        the cables alone (no contact is solved)."""
        p = params if params is not None else self.param_values(state.dtype, state.device)
        k = self.constants(state.dtype, state.device)
        return cables(state.transpose(-1, -2), self.rest_lengths(act, p), p, k)["tension"]
