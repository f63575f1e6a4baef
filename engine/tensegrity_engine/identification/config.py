"""Settings of an identification run and which parameters each environment identifies."""
from __future__ import annotations

import dataclasses
import math
import numbers
from typing import Optional

from tensegrity_engine.physics.params import SOFT_LAW_PARAMS, SPEC_BY_NAME

NONCONTACT_PARAMS = ("cable_stiffness", "cable_damping", "cable_slack_damping", "rod_mass",
                     "rod_inertia_factor", "actuator_time_constant", "actuator_max_speed", "actuator_gain",
                     "actuator_offset")
CONTACT_PARAMS = ("contact_stiffness", "contact_damping", "friction_sliding",
                  "friction_torsional", "friction_rolling")
# under the soft contact law the normal response of the ground and the rod pairs is its solref
SOFT_CONTACT_PARAMS = SOFT_LAW_PARAMS + ("friction_sliding", "friction_torsional", "friction_rolling")
SCHEDULES = ("progressive", "implicit_only", "feedforward", "fine_only", "online")
# schedules that end before a fine stage (so without Levenberg-Marquardt or pose windows)
COARSE_ONLY_SCHEDULES = ("implicit_only", "feedforward")
INITS = ("random", "given", "given+random")
WINDOWS_FROM = ("finite_difference", "start")


def contact_params(law: str = "penalty") -> tuple[str, ...]:
    """The values contact data identifies under a ground contact law."""
    return SOFT_CONTACT_PARAMS if law == "soft" else CONTACT_PARAMS


# A learn-list entry that names the ground contact's values under whichever law the robot's
# model uses (its normal response and sliding friction), so one list serves both laws.
CONTACT_TOKEN = "contact"


def resolve_learn(names, law: str, floor: bool = True) -> tuple[str, ...]:
    """``names`` with `CONTACT_TOKEN` expanded for ``law`` (None: `default_learnable`); a
    ValueError for an unknown name or one the law ignores (the soft law's solref under the
    penalty law, the penalty stiffness and damping under the soft law, whose rod pairs are
    soft constraints too)."""
    if names is None:
        return default_learnable(floor, law)
    out = []
    for name in names:
        out += list(contact_params(law)[:3]) if name == CONTACT_TOKEN else [name]
    if unknown := [n for n in out if n not in SPEC_BY_NAME]:
        raise ValueError(f"unknown parameter(s) to learn: {', '.join(unknown)}; known: "
                         f"{', '.join(SPEC_BY_NAME)} and '{CONTACT_TOKEN}'")
    if law == "penalty" and (inert := [n for n in out if n in SOFT_LAW_PARAMS]):
        raise ValueError(f"{', '.join(inert)} act only under the soft contact law; this robot's contact.law is "
                         f"'penalty' (learn {', '.join(CONTACT_PARAMS[:2])} there, or '{CONTACT_TOKEN}' for either law)")
    if law == "soft" and (inert := [n for n in out if n in CONTACT_PARAMS[:2]]):
        raise ValueError(f"{', '.join(inert)} act only under the penalty contact law; this robot's contact.law is "
                         f"'soft' (learn {', '.join(SOFT_LAW_PARAMS)} there, or '{CONTACT_TOKEN}' for either law)")
    return tuple(dict.fromkeys(out))


def default_learnable(floor: bool, law: str = "penalty") -> tuple[str, ...]:
    """Non-contact data (no floor) identifies the robot; contact data identifies contact
    (the values of the robot's contact ``law``)."""
    return contact_params(law) if floor else NONCONTACT_PARAMS


@dataclasses.dataclass
class IdentificationConfig:
    period: float = 0.1                 # s, T: sampling interval of the tuples
    learn: Optional[tuple] = None       # parameter names; None: default_learnable(env)
    per_element: tuple = ()             # names identified per cable / per rod
    bounds: Optional[dict] = None       # {name: (lo, hi)} overriding the broad default ranges
    schedule: str = "progressive"
    lr0: float = 0.1
    lr_min: float = 1e-4
    coarse_integrator: str = "implicit"
    fine_integrator: Optional[str] = None    # None: the robot model's (engine.integrator);
                                        # semi_implicit / implicitfast / rk4: fit a model stepped so
                                        # (the structure, `structure.py`); "ani"
    patience: int = 2                   # non-improving epochs before a stage change
    min_rel_improvement: float = 1e-3   # val loss (online tuple LM: also its own step's) must fall by this fraction
    max_stage_epochs: Optional[int] = 1 # epochs of a gradient stage (Algorithm 1's dt or lr halving,
                                        # an Adam fine stage; not Levenberg-Marquardt) before the next
                                        # (None: patience only); with the two below, the fastest
                                        # settings that still identify exactly (bench/performance.py;
                                        # 2 epochs took 1.6-2x as long for the same non-contact result)
    max_epochs: int = 10_000
    max_seconds: Optional[float] = None
    batch_size: int = 16
    epoch_tuples: Optional[int] = 128   # training tuples drawn per epoch (None: all)
    val_tuples: Optional[int] = 32      # fixed validation subset (None: all)
    w_vel: float = 1.0                  # weight of the end-node velocity term
    latent_velocity: Optional[bool] = None   # None: when the data has no velocities
    latent_lr_ratio: float = 0.1        # latent-velocity lr / parameter lr (fine_optimizer="adam")
    # pose-only LM: tuples per multiple-shooting window. Online too: windows of 5 were measured
    # against 3 (bench/online.py, 8 robots x 4 seeds, 2026-11-25): better 1 s-ahead prediction
    # on 4 robots, worse on 2, 3 published models (against 1) ending worse than the config,
    # and a narrower sigma covering the truth less (2-spread coverage 26 against 54 %)
    pose_window: int = 3
    lm_windows: int = 64                # pose-only LM: windows (fixed subset) per iteration
    latent_jacobian_reuse: int = 4      # pose-only LM: iterations a window's latent Jacobian is reused
    # pose-only LM: each iteration, one window in this many has its start velocity fitted
    # afresh from the finite differences and takes it where it fits better (0: never;
    # `solvers.windows.restart_latents`)
    latent_restart_every: int = 0
    # pose-only LM: a new window that continues another starts from that one's predicted end
    # velocity where it fits better (`solvers.chaining`: 10 Hz poses alias a rod's spin)
    chain_latents: bool = True
    # pose-only LM: a running windowed stage whose training data has grown this many times
    # since its windows were drawn starts again on all of it (0: only after its end)
    window_refresh: float = 2.0
    # pose-only LM: the windowed stage starts from the finite-difference stage's fit
    # ("finite_difference") or from the values the solver started from ("start"): the
    # finite-difference velocities' bias can lead into another basin (docs/online_identification.md)
    windows_from: str = "finite_difference"
    # pose-only: where rods carry IMUs, their gyro's angular velocity starts the latents and
    # holds each window's start beside the poses (`objective.window_residual`), with this
    # weight: an error of 1 rad/s counts as one of (half rod length x T) m per end node
    # (0: the IMU unused). Off by default: measured (bench/online.py --imu on|off, 5 robots x
    # 3 seeds) it predicted held-out data better on the twin and the noisy mocap and worse
    # on soft_slow, end_heavy and payload, whose spin the model cannot carry
    gyro_weight: float = 0.0
    # pose-only LM: where cable states were measured, the model's at each window sample and
    # start is fitted beside the poses (`identification.cable_rows`): tensions (load cells, a winch's
    # current) with ``tension_weight`` m/N (1 N off counts as this many m off in one end node's
    # position), rest lengths (winch encoders) with ``rest_length_weight`` m/m; 0: unused. The
    # mocap's position noise over the sensor's is the maximum-likelihood weight of a model
    # that is the robot; docs/online_identification.md measures it on robots that are not
    tension_weight: float = 0.0
    rest_length_weight: float = 0.0
    # pose-only LM: no window starts within this many actuator time constants (plus the
    # delay) of a stream's first command, where the motors' state is assumed (0: no wait)
    motor_settle: float = 5.0
    max_raw: float = 12.0               # |raw| beyond this = saturated/exploded -> rollback
    init: str = "random"                # "random" (within bounds), "given" (initial values) or
                                        # "given+random" (multi-start: the given values among the random ones)
    seed: int = 0
    n_starts: int = 16                  # multi-start: random starts scored on the dt=T loss, best kept
    coarse_work: int = 128              # coarse epoch: at most max(1, coarse_work // (T/dt)) minibatches
    coarse_lr_min: Optional[float] = None   # implicit phase lr floor (None: lr0 / 4)
    grad_clip: Optional[float] = 10.0   # clip the (normalised) parameter gradient norm
    fine_optimizer: str = "lm"          # "lm" (Levenberg-Marquardt) or "adam" for the fine stage
    lm_tuples: int = 256                # tuples per Levenberg-Marquardt iteration (random subset)
    lm_max_iters: int = 40
    # pose-only LM: the finite-difference stage moves on to the windows after this many
    # iterations (None: lm_max_iters); a structure challenger's is short (`online_structure`)
    fd_max_iters: Optional[int] = None
    lm_patience: int = 4                # non-improving LM iterations before the fine stage ends
    lm_tol: float = 1e-24               # normalised val loss at which LM stops (exact data: round-off)
    lm_step_tol: float = 1e-8           # LM stops when an accepted step moves no raw parameter more
    # pose-only windows: LM has converged when its last lm_patience accepted steps moved every
    # value by at most this many of its 1-sigma (0: off; the objective's tests alone)
    lm_settle_sigmas: float = 0.25
    coarse_time_fraction: float = 0.6   # with max_seconds: share of it the implicit phase may use
    normalize_loss: bool = True         # divide the loss by the zero-motion loss of the data
    collision: str = "differentiable"   # ground collision checker: "differentiable" or "mujoco"
                                        # (MuJoCo's mj_collision per state, no geometry gradient:
                                        # ablation (c) only, much slower)
    jacobian: Optional[str] = None      # Levenberg-Marquardt Jacobians: "central" (finite differences,
                                        # in the C kernel on the CPU), "forward_difference" (P rollouts,
                                        # not 2P), "one_sided" (per tuple or window the smaller of the
                                        # forward and backward difference: robust to the soft contact
                                        # law's jumps), "forward" (forward-mode AD, all columns in one
                                        # torch pass), None: forward on CUDA, else one_sided under the
                                        # soft law, central under the penalty law, forward_difference
                                        # without a floor
    compile_training: Optional[bool] = None # rollouts with gradient step a torch.compile'd engine step
                                        # (forward and backward fused; 27-60 s to compile per
                                        # integrator and batch shape, then a CPU epoch ~2.5x
                                        # faster); None: on CUDA only
    gradient_dtype: Optional[str] = None    # "float32": the rollouts backpropagated through (the Adam
                                        # stages: the implicit phase, an Adam fine stage) step in
                                        # float32 from the trainer's float64 values; Levenberg-Marquardt,
                                        # validation and the gate stay in the trainer's dtype (float32
                                        # there measured K -13 %, tau -62 % on exact data: its finite
                                        # differences drown in rounding). None: the trainer's dtype
    native_threads: int = 1             # threads of the C kernel's gradient-free rollouts (84 % of a
                                        # Levenberg-Marquardt fit's time, measured); 1 beside a
                                        # controller (the identifier node), the CLI's --threads offline
    forward_backend: Optional[str] = None   # gradient-free rollouts (Levenberg-Marquardt residuals,
                                        # validation): "native" (C kernel, CPU, a model integrator),
                                        # "torch", None: native where it applies

    def __post_init__(self):
        if self.schedule not in SCHEDULES:
            raise ValueError(f"schedule must be one of {SCHEDULES}, got {self.schedule!r}")
        if self.fine_integrator not in (None, "semi_implicit", "implicitfast", "rk4", "ani"):
            raise ValueError(f"fine_integrator must be None, 'semi_implicit', 'implicitfast', 'rk4' or 'ani', "
                             f"got {self.fine_integrator!r}")
        if self.fine_optimizer not in ("lm", "adam"):
            raise ValueError(f"fine_optimizer must be 'lm' or 'adam', got {self.fine_optimizer!r}")
        if self.collision not in ("differentiable", "mujoco"):
            raise ValueError(f"collision must be 'differentiable' or 'mujoco', got {self.collision!r}")
        if int(self.native_threads) != self.native_threads or self.native_threads < 1:
            raise ValueError(f"native_threads must be a positive integer, got {self.native_threads!r}")
        if self.gradient_dtype not in (None, "float32", "float64"):
            raise ValueError(f"gradient_dtype must be None, 'float32' or 'float64', got {self.gradient_dtype!r}")
        if self.forward_backend not in (None, "native", "torch"):
            raise ValueError(f"forward_backend must be None, 'native' or 'torch', got {self.forward_backend!r}")
        if self.jacobian not in (None, "central", "forward_difference", "one_sided", "forward"):
            raise ValueError("jacobian must be None, 'central', 'forward_difference', 'one_sided' or 'forward', "
                             f"got {self.jacobian!r}")
        if self.init not in INITS:
            raise ValueError(f"init must be one of {INITS}, got {self.init!r}")
        for name in ("period", "lr0", "lr_min"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be > 0")
        if self.fd_max_iters is not None and (int(self.fd_max_iters) != self.fd_max_iters or self.fd_max_iters < 1):
            raise ValueError(f"fd_max_iters must be None or a positive integer, got {self.fd_max_iters!r}")
        if not (math.isfinite(self.motor_settle) and self.motor_settle >= 0.0):
            raise ValueError(f"motor_settle must be finite and >= 0, not {self.motor_settle}")
        if not (math.isfinite(self.gyro_weight) and self.gyro_weight >= 0.0):
            raise ValueError(f"gyro_weight must be finite and >= 0, not {self.gyro_weight}")
        for name in ("tension_weight", "rest_length_weight"):
            if not (math.isfinite(getattr(self, name)) and getattr(self, name) >= 0.0):
                raise ValueError(f"{name} must be finite and >= 0, not {getattr(self, name)}")
        if self.windows_from not in WINDOWS_FROM:
            raise ValueError(f"windows_from must be one of {WINDOWS_FROM}, not {self.windows_from!r}")
        if not (self.lm_settle_sigmas >= 0.0 and math.isfinite(self.lm_settle_sigmas)):
            raise ValueError(f"lm_settle_sigmas must be finite and >= 0 (0: off), not {self.lm_settle_sigmas}")
        if not (self.window_refresh == 0.0 or self.window_refresh > 1.0):
            raise ValueError(f"window_refresh must be 0 (off) or > 1, not {self.window_refresh}")
        if self.pose_window < 2 or self.lm_windows < 1:
            raise ValueError("pose_window must be >= 2 (one pose per latent velocity does not "
                             "identify) and lm_windows >= 1")
        for name, least, meaning in (("latent_jacobian_reuse", 1, "1: a fresh latent Jacobian at every iteration"),
                                     ("latent_restart_every", 0, "0: never")):
            value = getattr(self, name)
            whole = (isinstance(value, numbers.Integral) and not isinstance(value, bool)) or \
                (isinstance(value, float) and value.is_integer())
            if not (whole and value >= least):
                raise ValueError(f"{name} must be an integer >= {least} ({meaning}), not {value!r}")
            setattr(self, name, int(value))
        if self.patience < 1 or self.batch_size < 1:
            raise ValueError("patience and batch_size must be >= 1")
        if self.learn is not None:
            self.learn = tuple(self.learn)
        self.per_element = tuple(self.per_element)

