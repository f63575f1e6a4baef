"""Native (C) forward-only rollouts of the engine's model integrators (semi-implicit,
implicitfast, rk4).

`NativeRollout(engine).rollout(...)` returns what ``engine.rollout(...)`` returns (the
robot model's integrator, or the one asked for), computed by ``semi_implicit.c``: all steps of all
samples in one call, without torch's per-op dispatch (the cost that dominates torch at
planning batch sizes). No gradients: use the torch engine to differentiate.

The C file is compiled on first use with the system C compiler (``cc``; the ``CC``
environment variable overrides it) into a per-user cache,
``$XDG_CACHE_HOME/tensegrity_ros/native`` (default ``~/.cache/...``), one shared library per
source, flags and compiler version; later processes load it directly. Without a working
compiler `NativeBuildError` says which command failed and why; nothing falls back silently.
"""
from __future__ import annotations

import ctypes
import hashlib
import importlib.resources
import math
import os
import re
import shlex
import subprocess
import tempfile
import threading
from pathlib import Path
from typing import Optional

import torch

from tensegrity_engine.physics.config import MODEL_INTEGRATORS
from tensegrity_engine.physics.work import METER

__all__ = ["NativeBuildError", "NativeRollout", "chunk_schedule", "compile_flags", "forward_rollout", "kernel_isa",
           "load_library", "target_arch"]

SOURCE = "semi_implicit.c"

# -ffp-contract=off: no implicit fused multiply-adds, so every product and sum rounds as in
# torch's separate elementwise ops (the kernel's explicit fma() calls reproduce MKL's small
# matmuls); the float64 equality tests rely on it. float32 (planning) contracts
# (compile_flags): its tests compare with float64 at float32's precision, and pass so (a
# fused product changes a cancellation such as a*b - c*d by float32 rounding), and it makes
# an MPPI step 6 % faster (AVX2 on 2 threads, 0.0532 -> 0.0498 s).
# No -ffast-math: reassociation and reciprocal divisions would change results.
# -fno-trapping-math: floating-point exceptions are never read, so a lane loop with a
# select around a division (a ternary) may compute both sides; without it GCC leaves such
# loops scalar. It changes no result.
# -fopenmp: the `omp simd` lane loops and threads over chunks of samples.
BASE_FLAGS = ("-O3", "-fno-math-errno", "-fno-trapping-math", "-ffp-contract=off", "-fopenmp", "-shared", "-fPIC")
# The instruction set: this CPU's (AVX-512 where present, else AVX2, ...), or the one
# TENSEGRITY_NATIVE_MARCH names (e.g. x86-64-v3 = AVX2 + FMA: the code an AVX2-only CPU
# runs, measurable on a newer one; or a common target for a cache shared between machines).
MARCH_ENV = "TENSEGRITY_NATIVE_MARCH"
# Samples per chunk: 8 (one 512-bit vector of float64, one 256-bit vector of float32). Fewer
# lanes than a float32 512-bit vector holds on purpose: MPPI's 40 samples make 5 chunks (3 + 2
# on two threads, not 2 + 1 of 16 with 8 padding lanes), and the soft ground's Newton loop
# runs to the slowest lane of a chunk. Measured at MPPI's sizes with the kernel of 2026-11-25
# (AVX2, soft law, back to back): 16 lanes 0.152 / 0.101 s per plan on 1 / 2 threads, 8 lanes
# 0.133 / 0.080.
LANES = {torch.float64: 8, torch.float32: 8}
_REAL = {torch.float32: ctypes.c_float, torch.float64: ctypes.c_double}


class NativeBuildError(RuntimeError):
    """The native kernel could not be compiled or loaded (no C compiler, compile error)."""


def target_arch() -> str:
    march = os.environ.get(MARCH_ENV) or "native"
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._+-]*", march):
        raise NativeBuildError(f"{MARCH_ENV}={march!r} is not a -march value (e.g. native, x86-64-v3)")
    return march


def _target_macros(compiler: list[str]) -> str:
    """The compiler's predefined macros for the target instruction set."""
    return _run([*compiler, f"-march={target_arch()}", "-dM", "-E", "-x", "c", os.devnull]).stdout


def kernel_isa() -> str:
    """The widest vector instruction set the kernel is compiled for ("AVX-512", "AVX2",
    "SSE2" or "other"), from the compiler's predefined macros for the target."""
    macros = _target_macros(_compiler())
    for macro, name in (("__AVX512F__", "AVX-512"), ("__AVX2__", "AVX2"), ("__SSE2__", "SSE2")):
        if macro in macros:
            return name
    return "other"


def compile_flags(dtype: torch.dtype) -> list[str]:
    if dtype not in LANES:
        raise TypeError(f"native rollouts support float32 and float64, got {dtype}")
    return [*BASE_FLAGS, f"-march={target_arch()}", f"-DLANES={LANES[dtype]}"] + (
        ["-DTG_FLOAT", "-ffp-contract=fast"] if dtype == torch.float32 else [])   # overrides BASE_FLAGS' off


def narrow_flags(flags: list[str]) -> list[str]:
    """The narrow unit's flags: the wide unit's with half the lanes."""
    return [f"-DLANES={int(f.split('=')[1]) // 2}" if f.startswith("-DLANES=") else f
            for f in flags] + ["-DTG_NARROW"]


def _compiler() -> list[str]:
    return shlex.split(os.environ.get("CC") or "cc")


def _cache_dir() -> Path:
    root = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(root) / "tensegrity_ros" / "native"


_FIX = ("Install a C compiler (e.g. gcc) or point CC at one; or plan with the torch engine "
        "(EngineDynamics(backend='torch'), CLI --backend torch)")


def _run(cmd: list[str]) -> subprocess.CompletedProcess:
    return _run_together([cmd])[0]


def _run_together(cmds: list[list[str]]) -> list[subprocess.CompletedProcess]:
    """Runs the commands at once (the kernel's two units compile in parallel)."""
    procs = []
    try:
        for cmd in cmds:
            procs.append((cmd, subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)))
    except OSError as err:
        for _, proc in procs:
            proc.kill()
            proc.communicate()
        raise NativeBuildError(f"cannot run the C compiler `{shlex.join(cmd)}`: {err}. {_FIX}") from err
    results = []
    try:
        for cmd, proc in procs:
            out, err = proc.communicate()
            results.append(subprocess.CompletedProcess(cmd, proc.returncode, out, err))
    finally:                       # interrupted: no compiler left writing into the build directory
        for _, proc in procs:
            if proc.returncode is None:
                proc.kill()
                proc.wait()
    return results


def _check_built(result: subprocess.CompletedProcess) -> None:
    if result.returncode:
        raise NativeBuildError(f"compiling the native kernel failed: `{shlex.join(result.args)}` exited "
                               f"with {result.returncode}:\n{result.stderr.strip()}\n{_FIX}")


_LIBRARIES: dict = {}
_LOCK = threading.Lock()


def load_library(dtype: torch.dtype) -> ctypes.CDLL:
    """The compiled kernel for ``dtype`` (compiled into the cache on first use)."""
    key = (dtype, os.environ.get("CC"), os.environ.get("XDG_CACHE_HOME"), target_arch())
    with _LOCK:
        if key not in _LIBRARIES:
            _LIBRARIES[key] = _build(dtype)
        return _LIBRARIES[key]


def _build(dtype: torch.dtype) -> ctypes.CDLL:
    source = importlib.resources.files(__package__).joinpath(SOURCE).read_bytes()
    compiler = _compiler()
    flags = compile_flags(dtype)
    version = _run([*compiler, "--version"])
    if version.returncode:
        raise NativeBuildError(f"`{shlex.join([*compiler, '--version'])}` failed: {version.stderr.strip()}. "
                               f"{_FIX}")
    # -march code is only valid on CPUs that have it: key the cache on what the compiler sees
    # (its predefined macros), so a home directory shared between machines stays safe.
    target = _target_macros(compiler)
    digest = hashlib.sha256(b"\0".join([source, shlex.join(compiler + flags).encode(),
                                        version.stdout.encode(), target.encode()])).hexdigest()[:24]
    cache = _cache_dir()
    library_path = cache / f"semi_implicit_{digest}.so"
    if not library_path.exists():
        cache.mkdir(parents=True, exist_ok=True)
        # Build in a private directory, then rename: parallel processes never see a partial file.
        with tempfile.TemporaryDirectory(dir=cache, prefix="build_") as tmp:
            src, lib = Path(tmp) / SOURCE, Path(tmp) / "kernel.so"
            src.write_bytes(source)
            wide, narrow = Path(tmp) / "wide.o", Path(tmp) / "narrow.o"
            # The same source twice: the wide unit (the entry point) and the narrow one (half
            # the lanes) that runs a batch's tail chunks; see tg_rollout.
            for result in _run_together([[*compiler, *flags, "-c", "-o", str(wide), str(src)],
                                         [*compiler, *narrow_flags(flags), "-c", "-o", str(narrow), str(src)]]):
                _check_built(result)
            _check_built(_run([*compiler, *flags, "-o", str(lib), str(wide), str(narrow), "-lm"]))
            os.replace(lib, library_path)
    try:
        library = ctypes.CDLL(str(library_path))
    except OSError as err:
        raise NativeBuildError(f"cannot load the native kernel {library_path}: {err}") from err
    real = _REAL[dtype]
    if library.tg_lanes() != LANES[dtype] or library.tg_real_size() != ctypes.sizeof(real):
        raise NativeBuildError(f"{library_path} does not match its build flags")
    library.tg_rollout.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int]
    library.tg_rollout.restype = ctypes.c_int
    library.tg_schedule.argtypes = [ctypes.c_int64, ctypes.c_int, ctypes.POINTER(ctypes.c_int64)]
    library.tg_schedule.restype = None
    return library


def chunk_schedule(batch: int, threads: int, dtype: torch.dtype = torch.float32) -> dict:
    """How the kernel splits ``batch`` samples over ``threads``: the threads it uses, its
    wide chunks (``LANES[dtype]`` samples each, from sample 0) and its narrow ones (half as
    many, from ``narrow_start``), as `tg_rollout` runs them."""
    out = (ctypes.c_int64 * 4)()
    load_library(dtype).tg_schedule(int(batch), int(threads), out)
    return {"threads": out[0], "wide": out[1], "narrow": out[2], "narrow_start": out[3]}


# ----------------------------------------------------------------------------- C structs
def _structs(real):
    """ctypes mirrors of tg_model and tg_io for one real type (field order as in the C file)."""
    i32, i64, preal, pi32 = ctypes.c_int32, ctypes.c_int64, ctypes.POINTER(real), ctypes.POINTER(ctypes.c_int32)

    class Model(ctypes.Structure):
        _fields_ = ([(n, i32) for n in ("rods", "cables", "actuated", "pairs", "floor", "has_fixed")]
                    + [("cable_lo", pi32), ("cable_hi", pi32)]
                    + [(n, preal) for n in ("cable_wpos_lo", "cable_wpos_hi", "cable_wax_lo", "cable_wax_hi")]
                    + [("cable_act", pi32)]
                    + [(n, preal) for n in ("passive_rest", "stiffness", "damping", "slack_damping", "gain",
                                            "offset", "decay", "tau", "max_speed", "command_low",
                                            "command_high")]
                    + [("actuate_mean", i32)]
                    + [(n, preal) for n in ("mass", "mass_gravity", "ia_minus_it", "inv_it",
                                            "inv_ia_minus_inv_it", "free", "half", "node_radius",
                                            "node_inv_mass")]
                    + [("pair_a", pi32), ("pair_b", pi32), ("pair_radius_a", preal), ("pair_radius_b", preal)]
                    + [(n, real) for n in ("h", "half_h", "ground_height", "contact_stiffness",
                                           "contact_damping", "mu", "mu_torsional", "mu_rolling",
                                           "angular_eps2", "friction_eps2")]
                    + [("inertia_t", preal), ("inertia_a", preal), ("implicitfast", i32), ("rk4", i32)]
                    + [("quarter_h", real), ("magnus", real)]
                    + [("soft_ground", i32), ("soft_condim", i32)]
                    + [(n, real) for n in ("soft_b", "soft_k", "soft_reg", "soft_dmin", "soft_dmax",
                                           "soft_width", "soft_mid", "soft_power")]
                    + [("soft_pairs", i32)])

    class IO(ctypes.Structure):
        _fields_ = ([(n, i64) for n in ("batch", "steps", "hold", "record_every")]
                    + [("state0", preal)] + [(n, i64) for n in ("s0_b", "s0_r", "s0_k")]
                    + [("act0", preal)] + [(n, i64) for n in ("a0_b", "a0_a")]
                    + [("commands", preal)] + [(n, i64) for n in ("c_b", "c_s", "c_a")]
                    + [("wrenches", preal)] + [(n, i64) for n in ("w_b", "w_s", "w_r", "w_k")]
                    + [("states", preal)] + [(n, i64) for n in ("o_b", "o_s", "o_r", "o_k")]
                    + [("acts", preal)] + [(n, i64) for n in ("oa_b", "oa_s", "oa_a")])

    return Model, IO


_STRUCTS = {dtype: _structs(real) for dtype, real in _REAL.items()}


def _ptr(t: torch.Tensor, ctype):
    return ctypes.cast(ctypes.c_void_p(t.data_ptr()), ctypes.POINTER(ctype))


# ----------------------------------------------------------------------------- rollouts
class NativeRollout:
    """Semi-implicit, implicitfast or rk4 (``integrator``, default the robot model's) rollouts of
    ``engine`` (a `TensegrityEngine`) in native code.

    Uses the engine's topology, floor, fixed rods, actuator timing and smoothing settings;
    ``ground_contact_fn`` is not supported. Parameters may be shared or per cable / per rod
    (anything `PhysicalParameters` produces); they are broadcast to one value per element.
    """

    def __init__(self, engine, *, threads: int = 1, integrator: Optional[str] = None):
        if engine.ground_contact_fn is not None:
            raise ValueError("NativeRollout does not support an external ground_contact_fn; use the "
                             "torch engine")
        self.integrator = engine.robot.integrator if integrator is None else integrator
        if self.integrator not in MODEL_INTEGRATORS:
            raise ValueError(f"the native kernel steps semi_implicit, implicitfast or rk4, not {self.integrator!r}; "
                             f"use the torch engine")
        self.engine = engine
        self.threads = int(threads)
        robot = engine.robot
        rod_of = robot.cable_node_index // 2
        self._cable_lo = torch.as_tensor(rod_of.min(1), dtype=torch.int32)
        self._cable_hi = torch.as_tensor(rod_of.max(1), dtype=torch.int32)
        position = {int(c): j for j, c in enumerate(robot.actuated_indices)}
        self._cable_act = torch.tensor([position.get(c, -1) for c in range(robot.num_cables)], dtype=torch.int32)
        self._last_model = None

    def rollout(self, state: torch.Tensor, act: torch.Tensor, commands: torch.Tensor, dt: float, *,
                record_every: int = 1, params: Optional[dict] = None,
                wrenches: Optional[torch.Tensor] = None, threads: Optional[int] = None):
        """As ``engine.rollout(state, act, commands, dt, integrator=self.integrator, ...)``:
        states [..., S // record_every, R, 13] and acts [..., S // record_every, A]."""
        return self.rollout_held(state, act, commands, dt, hold=1, record_every=record_every, params=params,
                                 wrenches=wrenches, threads=threads)

    def rollout_held(self, state: torch.Tensor, act: torch.Tensor, commands: torch.Tensor, dt: float, *,
                     hold: int, record_every: int = 1, params: Optional[dict] = None,
                     wrenches: Optional[torch.Tensor] = None, threads: Optional[int] = None):
        """`rollout` with each command row [..., K, A] held for ``hold`` steps (K hold steps):
        the same as ``rollout(commands.repeat_interleave(hold, -2))`` without the copy."""
        engine = self.engine
        R, A = engine.num_rods, engine.robot.num_actuated
        if record_every < 1 or hold < 1:
            raise ValueError("record_every and hold must be >= 1")
        tensors = [state, act, commands] + ([] if wrenches is None else [wrenches])
        if any(t.device.type != "cpu" for t in tensors):
            raise ValueError("native rollouts run on CPU tensors; use the torch engine on other devices")
        dtype = state.dtype
        if dtype not in LANES:
            raise TypeError(f"native rollouts support float32 and float64, got {dtype}")
        if params is None:
            with torch.no_grad():
                params = engine.param_values(dtype, "cpu")
        elif torch.is_grad_enabled() and any(v.requires_grad for v in params.values()):
            raise ValueError("native rollouts are forward-only: pass detached parameters (or call under "
                             "torch.no_grad()); use the torch engine for gradients")
        if torch.is_grad_enabled() and any(t.requires_grad for t in tensors):
            raise ValueError("native rollouts are forward-only: call under torch.no_grad() or detach the "
                             "inputs; use the torch engine for gradients")
        if state.shape[-2:] != (R, 13) or act.shape[-1:] != (A,) or commands.shape[-1:] != (A,):
            raise ValueError(f"expected state [..., {R}, 13], act [..., {A}], commands [..., S, {A}]; got "
                             f"{tuple(state.shape)}, {tuple(act.shape)}, {tuple(commands.shape)}")
        steps = commands.shape[-2] * hold
        batch_shapes = [state.shape[:-2], act.shape[:-1], commands.shape[:-2]]
        if wrenches is not None:
            if wrenches.shape[-3:] != (steps, R, 6):
                raise ValueError(f"wrenches must be [..., {steps}, {R}, 6], got {tuple(wrenches.shape)}")
            batch_shapes.append(wrenches.shape[:-3])
        batch = torch.broadcast_shapes(*batch_shapes)
        B, records = math.prod(batch), steps // record_every
        states = torch.empty(B, records, R, 13, dtype=dtype)
        acts = torch.empty(B, records, A, dtype=dtype)
        if B and records:
            def flat(t, tail):              # [B, *tail], broadcast batch dims as stride-0 views
                return t.to(dtype).expand(*batch, *tail).reshape(B, *tail)

            def pointer(t):
                return None if t is None else _ptr(t, _REAL[dtype])

            state_b, act_b = flat(state, (R, 13)), flat(act, (A,))
            cmd_b = flat(commands, (commands.shape[-2], A))
            wr_b = None if wrenches is None else flat(wrenches, (steps, R, 6))
            model, arrays = self._model(params, dtype, float(dt))   # arrays: what model points to
            io = _STRUCTS[dtype][1](
                B, steps, hold, record_every, pointer(state_b), *state_b.stride(), pointer(act_b),
                *act_b.stride(), pointer(cmd_b), *cmd_b.stride(), pointer(wr_b),
                *(wr_b.stride() if wr_b is not None else (0, 0, 0, 0)), pointer(states), *states.stride(),
                pointer(acts), *acts.stride())
            status = load_library(dtype).tg_rollout(ctypes.byref(model), ctypes.byref(io),
                                                    self.threads if threads is None else int(threads))
            del arrays
            if status:
                raise MemoryError("native rollout: could not allocate its work area")
            METER.add(self.integrator, engine.robot.contact.law, B * steps * R)
        return states.reshape(*batch, records, R, 13), acts.reshape(*batch, records, A)

    def _model(self, p: dict, dtype: torch.dtype, dt: float):
        """(tg_model, the arrays it points to) for parameters ``p``; the last one is reused
        while the same, unmodified parameter tensors come back (building costs ~0.4 ms, a
        planning rollout ~6 ms)."""
        values = [p[name] for name in sorted(p)]
        key = (dtype, dt, tuple(sorted(p)), tuple(v._version for v in values))
        last = self._last_model
        if last is not None and last[0] == key and all(a is b for a, b in zip(last[1], values)):
            return last[2]
        built = self._build_model(p, dtype, dt)
        self._last_model = (key, values, built)
        return built

    def _soft_ground(self, p: dict, dtype: torch.dtype, dt: float) -> dict:
        """The soft contact law's constants (`soft_contact.SoftGroundContact.rows`, and
        `soft_pairs.SoftPairRows.rows` for rod pairs), or off."""
        engine = self.engine
        forces = engine.force_model
        if not forces.soft_contacts:
            return {"soft_ground": 0, "soft_pairs": 0}
        contact = engine.robot.contact
        dmin, dmax, width, mid, power = (float(v) for v in contact.solimp)
        with torch.no_grad():
            tc = p["contact_time_constant"].detach().to(dtype).reshape(()).clamp(min=2.0 * dt)
            ratio = p["contact_damping_ratio"].detach().to(dtype).reshape(())
            mu = p["friction_sliding"].detach().to(dtype).reshape(())
            condim = contact.soft_condim
            return {"soft_ground": int(forces.soft_ground), "soft_pairs": int(forces.soft_pairs), "soft_condim": condim, "soft_b": float(2.0 / (dmax * tc)),
                    "soft_k": float(1.0 / (dmax * dmax * tc * tc * ratio * ratio)),
                    "soft_reg": float(2.0 * mu * mu * (1.0 + mu * mu)) if condim >= 3 else 1.0,
                    "soft_dmin": dmin, "soft_dmax": dmax, "soft_width": width, "soft_mid": mid,
                    "soft_power": power}

    def _build_model(self, p: dict, dtype: torch.dtype, dt: float):
        """tg_model and the arrays it points to; derived constants use the engine's own torch
        expressions in ``dtype``, so they round exactly as in `TensegrityEngine`."""
        engine, robot = self.engine, self.engine.robot
        R, C, A = engine.num_rods, robot.num_cables, robot.num_actuated
        k = engine.constants(dtype, "cpu")
        Model, real = _STRUCTS[dtype][0], _REAL[dtype]

        def per(name, n):
            v = p[name].detach().to(dtype=dtype, device="cpu").reshape(-1)
            if v.numel() not in (1, n):
                raise ValueError(f"parameter {name} has {v.numel()} values; native rollouts take 1 or {n}")
            return v.expand(n).contiguous()

        def scalar(name):
            return float(per(name, 1)[0])

        with torch.no_grad():
            stiffness, damping = per("cable_stiffness", C), per("cable_damping", C)
            slack_share = per("cable_slack_damping", C)                         # as ForceModel
            mass = per("rod_mass", R)
            tau, gain, offset = (per(n, A) for n in ("actuator_time_constant", "actuator_gain", "actuator_offset"))
            decay = torch.exp(-dt / tau)                                       # as actuators.actuator_update
            inertia_factor = per("rod_inertia_factor", R)
            it = mass * k["it"] * inertia_factor                                # as RigidRods.accelerations
            ia = mass * k["ia"]
            inv_t, inv_a = 1.0 / it, 1.0 / ia
            W = k["W"]
            lo, hi = self._cable_lo.long(), self._cable_hi.long()
            rows = torch.arange(C)
            passive = torch.as_tensor(robot.cable_rest_length, dtype=dtype)
            arrays = {
                "cable_wpos_lo": W[rows, lo], "cable_wpos_hi": W[rows, hi],
                "cable_wax_lo": W[rows, R + lo], "cable_wax_hi": W[rows, R + hi],
                "passive_rest": passive, "stiffness": stiffness,
                "damping": (1.0 - slack_share) * damping, "slack_damping": slack_share * damping,
                "gain": gain, "offset": offset, "decay": decay, "tau": tau,
                "max_speed": per("actuator_max_speed", A),
                "command_low": k["command_low"], "command_high": k["command_high"],
                "mass": mass, "mass_gravity": mass * k["gravity_col"], "ia_minus_it": ia - it,
                "inv_it": inv_t, "inv_ia_minus_inv_it": inv_a - inv_t, "free": k["free"], "half": k["half"],
                "node_radius": k["node_radius"],
                "node_inv_mass": (k["node_compliance_axial"] + k["node_compliance_transverse"]    # as ForceModel
                                  / inertia_factor.repeat_interleave(2)) / mass.repeat_interleave(2),  # .ground_friction
                "pair_radius_a": k["pair_radius_a"], "pair_radius_b": k["pair_radius_b"],
                "inertia_t": it, "inertia_a": ia,
            }
            arrays = {name: v.to(dtype).contiguous() for name, v in arrays.items()}
            ints = {"cable_lo": self._cable_lo, "cable_hi": self._cable_hi, "cable_act": self._cable_act,
                    "pair_a": k["pair_a"].to(torch.int32).contiguous(),
                    "pair_b": k["pair_b"].to(torch.int32).contiguous()}
            model = Model(
                rods=R, cables=C, actuated=A, pairs=engine.num_pairs, floor=int(engine.floor),
                has_fixed=int(bool(engine.fixed_rods)), actuate_mean=int(engine.actuator_timing == "mean"),
                h=dt, half_h=0.5 * dt, ground_height=robot.contact.ground_height,
                contact_stiffness=scalar("contact_stiffness"), contact_damping=scalar("contact_damping"),
                mu=scalar("friction_sliding"), mu_torsional=scalar("friction_torsional"),
                mu_rolling=scalar("friction_rolling"),
                angular_eps2=engine.angular_smoothing * engine.angular_smoothing,
                friction_eps2=engine.friction_smoothing * engine.friction_smoothing,
                implicitfast=int(self.integrator == "implicitfast"), rk4=int(self.integrator == "rk4"),
                quarter_h=0.5 * (0.5 * dt), magnus=dt / 12.0,
                **self._soft_ground(p, dtype, dt),
                **{name: _ptr(v, real) for name, v in arrays.items()},
                **{name: _ptr(v, ctypes.c_int32) for name, v in ints.items()})
        return model, (arrays, ints)


def forward_rollout(engine, state: torch.Tensor, act: torch.Tensor, commands: torch.Tensor, dt: float, *,
                    integrator: Optional[str] = None, wrenches: Optional[torch.Tensor] = None,
                    params: Optional[dict] = None, record_every: int = 1):
    """``engine.rollout(...)``, in the C kernel wherever it applies: no gradient wanted, CPU
    float32/64 tensors, a semi-implicit, implicitfast or rk4 model (`MODEL_INTEGRATORS`),
    the engine's own ground. The same numbers to rounding, ~20x faster
    at evaluation batch sizes. A missing C compiler
    raises `NativeBuildError` (nothing falls back silently)."""
    integrator = engine.robot.integrator if integrator is None else integrator
    tensors = [state, act, commands] + ([] if wrenches is None else [wrenches])
    applies = (integrator in MODEL_INTEGRATORS and engine.native_kernel_applies
               and not torch.is_grad_enabled() and state.dtype in LANES
               and all(t.device.type == "cpu" for t in tensors))
    if not applies:
        return engine.rollout(state, act, commands, dt, integrator=integrator, wrenches=wrenches,
                              params=params, record_every=record_every)
    return NativeRollout(engine, integrator=integrator).rollout(
        state, act, commands, dt, record_every=record_every, params=params, wrenches=wrenches)
