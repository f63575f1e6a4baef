"""Dynamics adapters for planning: `EngineDynamics` runs the differentiable engine
(`physics.engine.TensegrityEngine`) at a configurable planning step and integrator (by
default the model's own step in the fused C kernel of `tensegrity_engine.physics.native`);
`MujocoDynamics` runs ``mujoco.rollout`` on the MuJoCo twin (the ground-truth baseline).
Both have the signature of `interfaces.Dynamics`."""
from __future__ import annotations

import copy
import dataclasses

import math
from typing import Optional

import numpy as np
import torch

from tensegrity_engine.control.interfaces import as_tensor
from tensegrity_engine.physics.actuators import delayed_commands
from tensegrity_engine.physics.config import MODEL_INTEGRATORS, RobotConfig
from tensegrity_engine.physics.engine import TensegrityEngine
from tensegrity_engine.physics.graphs import GRAPH_INTEGRATORS, CapturedRollout
from tensegrity_engine.physics.params import PhysicalParameters
from tensegrity_engine.physics.residual import physics_fingerprint
from tensegrity_engine.physics.stability import stable_substeps

_ENGINES: dict = {}


def _inductor_config():
    import torch._inductor.config as config
    return config


def _shared_engine(robot: RobotConfig, floor: bool, actuator_timing: str, device) -> TensegrityEngine:
    """One `TensegrityEngine` per (robot object, floor, actuator timing, device), shared by
    every `EngineDynamics` of the process. Parameters are always passed explicitly to the
    rollout, so sharing is safe; it keeps torch.compile to one trace per step shape (a new
    engine object would fail dynamo's guards and retrace, and after 8 retraces of the same
    code dynamo silently falls back to eager)."""
    key = (id(robot), bool(floor), actuator_timing, str(device))
    hit = _ENGINES.get(key)
    if hit is None or hit[0] is not robot:
        engine = TensegrityEngine(robot, None, floor=floor, actuator_timing=actuator_timing)
        engine.to(device)
        hit = _ENGINES[key] = (robot, engine)
    return hit[1]


class EngineDynamics:
    """Planning rollouts on the differentiable engine (no grad).

    ``dt`` is the planning step (must divide ``control_dt``); ``integrator`` one of the
    engine's (None: the robot model's, ``engine.integrator``). ``actuator_timing`` defaults to "start" (as MuJoCo) at the robot's native
    step and to "mean" (the filter's exact average over the step) at coarser steps.
    Measured on SUPERball vs MuJoCo (40 random 1 s plans from rest): only the native 1 ms
    semi-implicit step keeps per-knot CoM displacements well correlated (r ~ 0.86); the
    implicit integrator is stable at 10-100 ms but its correlation drops (0.56 at 10 ms,
    0.16 at 50 ms), semi-implicit diverges above ~2 ms. Default: 1 ms semi-implicit.
    Closed loop (SUPERball to (5, 0), nominal engine, MPPI 1 it x 40 samples, executed on
    MuJoCo): 1 ms with a 0.5 s horizon reaches 0.85 m/s and ends 0.76 m from the goal;
    2 ms (stable, half the steps) only 0.45 m/s at 0.5 s horizon and 0.05 m/s at 1 s.

    ``backend``: "native" runs the rollouts (semi-implicit, implicitfast or rk4) in the fused C kernel
    (`tensegrity_engine.physics.native`, compiled with the system C compiler on first use and
    cached per user): the same step to rounding, ~40x faster than the compiled torch step
    at 40 samples (MPPI at the paper's sizes, 5 it x 40 samples x 1 s: ~0.03 s per control
    step on one core, vs ~1.0-1.4 s compiled). ``threads`` sets its OpenMP threads (whole
    chunks of samples each): 2 plan ~1.5x faster at 40 samples when the second core is
    idle, slower when another job holds it, hence the default 1. "torch"
    runs the torch engine (any integrator or device). Default (None): native for the
    semi-implicit integrator on CPU unless ``compile`` is given (which asks for torch).
    Without a working C compiler the native backend raises `native.NativeBuildError`
    saying so; pass ``backend="torch"`` (CLI ``--backend torch``) to plan without one.

    ``compile`` (torch backend; default True, not for the "ani" integrator) runs the
    rollouts through the engine's torch.compile'd step: ~2.5-3x faster than eager at 40
    samples, but the first call of a process traces and compiles (~15-25 s at idle, more
    under load; later processes reuse inductor's on-disk cache for the kernels), with
    inductor's C++ wrapper. Each (integrator, dt, batch size) compiles once; if
    compilation fails the adapter warns and runs eager.

    ``graphs`` (torch backend; default on CUDA) replays each rollout shape from one CUDA graph
    (`physics.graphs.CapturedRollout`): a 1 000-step planning rollout is then one launch
    instead of thousands of small kernels. Semi-implicit models only (the implicit steps'
    linear solves synchronise with the host); others, also when swapped in, plan without.
    Off a GPU the same buffered path runs directly.
    """

    def __init__(self, robot: RobotConfig, params: Optional[PhysicalParameters] = None, *,
                 control_dt: float = 0.1, dt: Optional[float] = None,
                 integrator: Optional[str] = None, actuator_timing: Optional[str] = None,
                 device="cpu", dtype: torch.dtype = torch.float32, floor: bool = True,
                 compile: Optional[bool] = None, backend: Optional[str] = None, threads: int = 1,
                 graphs: Optional[bool] = None):
        self.robot = robot
        self.planning_dt = self.dt = float(robot.dt if dt is None else dt)
        self.control_dt = float(control_dt)
        self.substeps = int(round(self.control_dt / self.dt))
        if self.substeps < 1 or abs(self.substeps * self.dt - self.control_dt) > 1e-9:
            raise ValueError(f"planning dt {self.dt} must divide control_dt {self.control_dt}")
        if actuator_timing is None:
            actuator_timing = "start" if self.dt <= robot.dt * (1 + 1e-9) else "mean"
        # None: the model's own (an identified model's, else the config's), followed on swaps
        self._follow_model = integrator is None
        integrator = (params.robot if params is not None else robot).integrator if integrator is None else integrator
        self.integrator = integrator
        self.device = torch.device(device)
        self.dtype = dtype
        self.engine = _shared_engine(robot, floor, actuator_timing, self.device)
        if backend is None:
            backend = ("native" if integrator in MODEL_INTEGRATORS and self.device.type == "cpu"
                       and compile is None and self.engine.native_kernel_applies else "torch")
        if backend not in ("torch", "native"):
            raise ValueError(f"backend must be 'torch' or 'native', got {backend!r}")
        self.backend = backend
        self.threads = int(threads)
        if backend == "native":
            if integrator not in MODEL_INTEGRATORS:
                raise ValueError(f"the native backend runs the {', '.join(MODEL_INTEGRATORS)} integrators, "
                                 f"not {integrator!r}; use backend='torch'")
            if self.device.type != "cpu":
                raise ValueError("the native backend runs on the CPU; use backend='torch' on other devices")
            if compile:
                raise ValueError("compile=True applies to the torch backend, not the native one")
            from tensegrity_engine.physics import native
            native.load_library(dtype)              # compile now: a missing compiler fails here, clearly
            self._native = native.NativeRollout(self.engine, threads=self.threads, integrator=integrator)
            self.compile = False
        else:
            self.compile = (integrator != "ani") if compile is None else bool(compile)
            if self.compile and integrator == "ani":
                raise ValueError("compile=True supports the 'semi_implicit' and 'implicit' integrators")
        if graphs and self.backend != "torch":
            raise ValueError("graphs=True replays torch rollouts; it needs backend='torch'")
        if graphs and integrator not in GRAPH_INTEGRATORS:
            raise ValueError(f"graphs=True replays {GRAPH_INTEGRATORS} rollouts; {integrator!r} solves linear "
                             f"systems (a host synchronisation no CUDA graph can hold) or picks its steps at "
                             f"run time")
        # whole rollouts as one CUDA graph (`physics.graphs`): by default on CUDA
        self.graphs = (self.backend == "torch" and self.device.type == "cuda"
                       if graphs is None else bool(graphs))
        self._captured = None
        self.in_force = None        # [A] the command the robot runs now (see __call__)
        self.residual = None        # a `physics.residual.ResidualModel` applied after every control step
        self.set_params(params if params is not None else PhysicalParameters(robot))

    def set_params(self, params: PhysicalParameters) -> None:
        """Swap the model's physical parameters (e.g. after identification); a model stepped
        with another integrator (its ``engine.integrator``) is planned with it, unless the
        integrator was given explicitly; a model with another ground contact law (or soft
        contact settings) is always planned with its own."""
        rebuild = False
        contact = params.robot.contact
        own = self.engine.robot.contact
        if (contact.law, contact.solimp, contact.soft_condim) != (own.law, own.solimp, own.soft_condim):
            robot = self.engine.robot.replace(contact=dataclasses.replace(
                own, law=contact.law, solimp=contact.solimp, condim=contact.soft_condim))
            self.engine = TensegrityEngine(robot, None, floor=self.engine.floor,
                                           actuator_timing=self.engine.actuator_timing).to(self.device)
            self._captured, rebuild = None, True
        if self._follow_model and params.robot.integrator != self.integrator:
            self.integrator = params.robot.integrator
            rebuild = True
        if rebuild and self.backend == "native":
            self._native = type(self._native)(self.engine, threads=self.threads, integrator=self.integrator)
        self._params = params
        self._physics_id = physics_fingerprint(params)
        with torch.no_grad():
            self._p = {k: v.detach().to(dtype=self.dtype, device=self.device)
                       for k, v in params.values().items()}
        self.delay = float(self._p["actuator_delay"].reshape(()))
        # a semi-implicit step the model's stiffness, damping and masses allow (identification
        # rolls it out the same way): dt = planning_dt / k
        k = (stable_substeps(self.engine.topology, self._p, self.planning_dt, floor=self.engine.floor,
                             integrator=self.integrator)
             if self.integrator in MODEL_INTEGRATORS else 1)
        self.dt = self.planning_dt / k
        self.substeps = int(round(self.control_dt / self.dt))

    def _timed(self, plans: torch.Tensor, in_force) -> torch.Tensor:
        """[N, H * substeps, A] engine-step commands as they act: ``actuator_delay`` late,
        the command in force now (``in_force``, else the plans' first) filling the dead time."""
        N, H, A = plans.shape
        fine = plans.repeat_interleave(self.substeps, dim=1)
        lead = max(0, math.ceil(self.delay / self.dt - 1e-9))
        now = plans[:, :1] if in_force is None else as_tensor(in_force, self.dtype, self.device).reshape(1, 1, A)
        history = torch.cat([now.expand(N, lead, A), fine], 1)
        return delayed_commands(history, torch.tensor(self.delay, dtype=torch.float64), self.dt)[:, lead:]

    @property
    def params(self) -> PhysicalParameters:
        return self._params

    def set_residual(self, model) -> None:
        """Plan with physics + a learned residual (`physics.residual.ResidualModel`, trained
        for one control period): every control step is a physics segment followed by the
        correction. None: physics alone. A residual that records the physics it was trained
        on is applied only while the planner plans with that physics (`residual_active`): a
        model swapped in by identification leaves it inactive, not misapplied."""
        if model is not None:
            if not model.use_physics:
                raise ValueError("a purely learned model has no physics to plan with")
            if abs(model.period - self.control_dt) > 1e-9:
                raise ValueError(f"the residual corrects {model.period} s periods; this planner steps "
                                 f"{self.control_dt} s")
            model = copy.deepcopy(model).to(dtype=self.dtype, device=self.device).eval()   # the caller's stays
        self.residual = model

    @property
    def residual_active(self) -> bool:
        """A residual is set, and trained on the physics planned with now (or not recorded)."""
        r = self.residual
        return r is not None and (r.physics is None or r.physics == self._physics_id)

    def _with_residual(self, s, a, fine) -> torch.Tensor:
        """Rollouts [N, H, R, 13] of engine-step commands ``fine`` [N, H * substeps, A], the
        residual applied after each control step."""
        out, k = [], self.substeps
        for h in range(fine.shape[1] // k):
            seg = fine[:, h * k:(h + 1) * k].contiguous()
            if self.backend == "native":
                states, acts = self._native.rollout(s, a, seg, self.dt, record_every=k, params=self._p)
            else:
                states, acts = self.engine.rollout(s, a, seg, self.dt, integrator=self.integrator, record_every=k,
                                                   params=self._p)
            x_hat = states[:, -1]
            rest, tension = self.engine.rest_lengths(a, self._p), self.engine.cable_tensions(s, a, self._p)
            s = self.residual(s, x_hat, rest, tension, self.control_dt).contiguous()
            a = acts[:, -1].contiguous()
            out.append(s)
        return torch.stack(out, 1)

    @torch.no_grad()
    def advance(self, state0, act0, commands) -> tuple[np.ndarray, np.ndarray]:
        """One trajectory through ``commands`` [S, A] (a row per step ``dt``, as they act:
        the caller applies any dead time): the final (rod_state [R, 13], act [A]) as float64
        numpy, e.g. the state when a command being planned takes effect."""
        c = as_tensor(commands, self.dtype, self.device)
        S = int(c.shape[0])
        s = as_tensor(state0, self.dtype, self.device).reshape(1, -1, 13).contiguous()
        a = as_tensor(act0, self.dtype, self.device).reshape(1, -1).contiguous()
        if self.backend == "native":
            states, acts = self._native.rollout(s, a, c[None].contiguous(), self.dt, record_every=S, params=self._p)
        else:
            states, acts = self.engine.rollout(s, a, c[None].contiguous(), self.dt, integrator=self.integrator,
                                               record_every=S, params=self._p)
        return (states[0, -1].double().cpu().numpy(), acts[0, -1].double().cpu().numpy())

    @torch.no_grad()
    def __call__(self, state0, act0, plans) -> torch.Tensor:
        """A model with an ``actuator_delay`` keeps running ``in_force`` (the command the
        robot runs now, set by the controller before it plans; None: the plans' first knot)
        for that long."""
        plans = as_tensor(plans, self.dtype, self.device)
        N, H, A = plans.shape
        if self.residual_active:
            s = as_tensor(state0, self.dtype, self.device).expand(N, -1, -1).contiguous()
            a = as_tensor(act0, self.dtype, self.device).expand(N, A).contiguous()
            fine = self._timed(plans, self.in_force) if self.delay else plans.repeat_interleave(self.substeps, dim=1)
            return self._with_residual(s, a, fine)
        if self.delay:
            s = as_tensor(state0, self.dtype, self.device).expand(N, -1, -1).contiguous()
            a = as_tensor(act0, self.dtype, self.device).expand(N, A).contiguous()
            fine = self._timed(plans, self.in_force).contiguous()
            if self.backend == "native":
                return self._native.rollout(s, a, fine, self.dt, record_every=self.substeps, params=self._p)[0]
            return self.engine.rollout(s, a, fine, self.dt, integrator=self.integrator,
                                       record_every=self.substeps, params=self._p)[0]
        if self.backend == "native":
            s = as_tensor(state0, self.dtype, self.device)
            a = as_tensor(act0, self.dtype, self.device)
            return self._native.rollout_held(s.expand(N, *s.shape[-2:]), a.expand(N, A), plans, self.dt,
                                             hold=self.substeps, record_every=self.substeps, params=self._p)[0]
        s = as_tensor(state0, self.dtype, self.device).expand(N, -1, -1).contiguous()
        a = as_tensor(act0, self.dtype, self.device).expand(N, A).contiguous()
        fine = plans.repeat_interleave(self.substeps, dim=1)
        if self.graphs and self.integrator in GRAPH_INTEGRATORS:   # a swapped-in model may step otherwise
            try:
                if self._captured is None or self._captured.integrator != self.integrator:
                    self._captured = CapturedRollout(self.engine, integrator=self.integrator,
                                                     compile_step=self.compile)
                return self._captured(s, a, fine, self.dt, params=self._p, record_every=self.substeps)[0]
            except Exception as err:  # capture or compilation failed: say so, plan without graphs
                import warnings
                warnings.warn(f"EngineDynamics: CUDA graph capture failed ({type(err).__name__}: "
                              f"{str(err).splitlines()[0] if str(err) else ''}); planning without graphs")
                self.graphs = False
        run = lambda c: self.engine.rollout(s, a, fine, self.dt, integrator=self.integrator,
                                            record_every=self.substeps, params=self._p, compile=c)[0]
        if self.compile:
            try:
                # C++ wrapper around inductor's kernels: ~20% less fixed overhead per step
                # (0.20 vs 0.25 ms per batched step at 40 samples, 1 thread)
                with _inductor_config().patch(cpp_wrapper=True):
                    return run(True)
            except Exception as err:  # no C compiler, unsupported backend, ...
                import warnings
                warnings.warn(f"EngineDynamics: torch.compile failed ({type(err).__name__}: "
                              f"{str(err).splitlines()[0] if str(err) else ''}); running eager")
                self.compile = False
        return run(False)


class MujocoDynamics:
    """Planning rollouts on the MuJoCo twin through ``mujoco.rollout`` (native threads).

    Runs at the twin's own step (robot.dt); returns float32 torch tensors on ``device``.
    """

    def __init__(self, twin, *, control_dt: float = 0.1, device="cpu",
                 dtype: torch.dtype = torch.float32):
        self.twin = twin
        self.robot = twin.robot
        self.control_dt = float(control_dt)
        self.substeps = int(round(self.control_dt / self.robot.dt))
        if self.substeps < 1 or abs(self.substeps * self.robot.dt - self.control_dt) > 1e-9:
            raise ValueError(f"twin step {self.robot.dt} must divide control_dt {control_dt}")
        self.device = torch.device(device)
        self.dtype = dtype

    def __call__(self, state0, act0, plans) -> torch.Tensor:
        to_np = lambda x: (x.detach().cpu().double().numpy() if isinstance(x, torch.Tensor)
                           else np.asarray(x, dtype=np.float64))
        plans = to_np(plans)
        N = plans.shape[0]
        fine = np.repeat(plans, self.substeps, axis=1)
        s0 = np.broadcast_to(to_np(state0), (N,) + to_np(state0).shape[-2:])
        a0 = np.broadcast_to(to_np(act0), (N, plans.shape[-1]))
        states, _ = self.twin.rollout(s0, a0, fine, record_every=self.substeps)
        return torch.as_tensor(states, dtype=self.dtype, device=self.device)
