"""Physical parameters of the engine, bounded by reparameterisation.

Every parameter is stored as an unconstrained raw tensor ``z`` and read through

    value = exp(log(lo) + (log(hi) - log(lo)) * sigmoid(z))      (positive, log scale)
    value = lo + (hi - lo) * sigmoid(z)                            (signed, linear scale)

so an optimiser can never push a stiffness negative or a time constant to zero, and
nothing else in the code base needs to clamp.  Bounds are broad physical ranges, not
tuned to any robot; a YAML ``identification.bounds`` section can override them.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Iterable, Mapping, Optional

import numpy as np
import torch
from torch import nn

from tensegrity_engine.physics.config import ConfigError, RobotConfig, load_robot


@dataclasses.dataclass(frozen=True)
class ParamSpec:
    name: str
    lower: float
    upper: float
    log_scale: bool
    group: str        # "cable", "rod" or "global": what a per-element parameter is per
    unit: str
    description: str
    # a limit: it acts only where the motion reaches it, so data that never do leave it inert
    # (no excitation of that kind determines it, and none is needed to predict that kind)
    limit: bool = False


# Broad ranges a roboticist would accept for a SUPERball-class robot (1-100 kg rods,
# 1e2-1e6 N/m cables).  Identification starts from random values inside them.
PARAM_SPECS: tuple[ParamSpec, ...] = (
    ParamSpec("cable_stiffness", 1e2, 1e6, True, "cable", "N/m", "cable spring constant K"),
    ParamSpec("cable_damping", 1.0, 1e4, True, "cable", "N s/m", "cable damping along the cable"),
    # 1e-3: a damped spring that only pulls; 1: a tendon damper acting taut or slack
    ParamSpec("cable_slack_damping", 1e-4, 1.0, True, "cable", "-",
              "share of the cable damping that acts whether the cable is taut or slack"),
    ParamSpec("rod_mass", 0.1, 100.0, True, "rod", "kg", "rod mass (inertia scales with it)"),
    # 1: uniform rod; 3: all the mass at the ends (m L^2 / 4); room on both sides
    ParamSpec("rod_inertia_factor", 0.05, 4.0, True, "rod", "-",
              "transverse inertia over a uniform solid rod's (1 + 2f with a fraction f of the mass at the ends)"),
    ParamSpec("actuator_time_constant", 2e-3, 1.0, True, "global", "s",
              "first-order motor time constant tau"),
    # winch speed limit; the default 1e3 never binds (tau * speed >= 2 m)
    ParamSpec("actuator_max_speed", 1e-3, 1e4, True, "global", "m/s",
              "top speed of the filtered command (winch cable speed / gain)", limit=True),
    # linear: zero (none) is inside; negative: a pose clock ahead of the command clock
    ParamSpec("actuator_delay", -0.05, 0.1, False, "global", "s",
              "time a command takes to act as the pose stamps see it (dead time + mocap latency)"),
    ParamSpec("actuator_gain", 0.5, 1.5, True, "global", "-", "rest length per commanded metre"),
    ParamSpec("actuator_offset", -0.2, 0.2, False, "global", "m", "rest-length calibration offset"),
    ParamSpec("contact_stiffness", 1e3, 1e7, True, "global", "N/m", "contact normal stiffness"),
    ParamSpec("contact_damping", 1.0, 1e5, True, "global", "N s/m", "contact normal damping"),
    ParamSpec("friction_sliding", 0.01, 3.0, True, "global", "-", "Coulomb sliding coefficient"),
    ParamSpec("friction_torsional", 1e-5, 1.0, True, "global", "m", "torsional friction length"),
    ParamSpec("friction_rolling", 1e-6, 1.0, True, "global", "m", "rolling friction length"),
    # the soft contact law's solref (`physics.soft_contact`); inert under the penalty law
    ParamSpec("contact_time_constant", 1e-3, 1.0, True, "global", "s",
              "soft contact: time constant of the constraint's reference spring-damper (solref[0])"),
    ParamSpec("contact_damping_ratio", 0.05, 20.0, True, "global", "-",
              "soft contact: damping ratio of the reference spring-damper (solref[1])"),
)
SPEC_BY_NAME = {spec.name: spec for spec in PARAM_SPECS}
SOFT_LAW_PARAMS = ("contact_time_constant", "contact_damping_ratio")     # inert under the penalty law


def nominal_values(robot: RobotConfig) -> dict[str, np.ndarray]:
    """Per-element nominal values straight from the config."""
    fr = robot.contact.friction
    return {
        "cable_stiffness": robot.cable_stiffness,
        "cable_damping": robot.cable_damping,
        "cable_slack_damping": robot.cable_slack_damping,
        "rod_mass": robot.rod_mass,
        "rod_inertia_factor": robot.rod_inertia_factor,
        "actuator_time_constant": np.array([robot.actuator.time_constant]),
        "actuator_max_speed": np.array([robot.actuator.max_speed]),
        "actuator_delay": np.array([robot.actuator.delay]),
        "actuator_gain": np.array([robot.actuator.gain]),
        "actuator_offset": np.array([robot.actuator.offset]),
        "contact_stiffness": np.array([robot.contact.stiffness]),
        "contact_damping": np.array([robot.contact.damping]),
        "friction_sliding": np.array([fr.sliding]),
        "friction_torsional": np.array([fr.torsional]),
        "friction_rolling": np.array([fr.rolling]),
        "contact_time_constant": np.array([robot.contact.solref[0]]),
        "contact_damping_ratio": np.array([robot.contact.solref[1]]),
    }


class ParameterError(ValueError):
    """Parameter values that must not be used; ``reason`` is a short key for counters."""

    def __init__(self, reason: str, message: str):
        super().__init__(message)
        self.reason = reason


def element_count(robot: RobotConfig, name: str) -> int:
    """Entries of a per-element value of ``name``: cables, rods, or 1."""
    return {"cable": robot.num_cables, "rod": robot.num_rods, "global": 1}[SPEC_BY_NAME[name].group]


def checked_parameters(robot: RobotConfig, values: Mapping[str, object], *,
                       bounds: Mapping[str, tuple[float, float]] | None = None,
                       complete: bool = False) -> "PhysicalParameters":
    """`PhysicalParameters` from values nobody vouches for (a topic, a file), or `ParameterError`.

    Every name must be known; each value has one entry (shared) or one per cable / rod as
    its spec says; all finite and strictly inside the project's bounds (`PARAM_SPECS`).
    ``bounds`` (e.g. a message's) may only narrow those bounds. Names not given keep the
    robot's nominal values, unless ``complete`` (a whole model, as a topic carries) asks
    for every name."""
    bounds = dict(bounds or {})
    unknown = (set(values) | set(bounds)) - set(SPEC_BY_NAME)
    if unknown:
        raise ParameterError("unknown_name", f"unknown parameter name(s) {sorted(unknown)}")
    missing = set(SPEC_BY_NAME) - set(values)
    if complete and missing:
        raise ParameterError("missing_name", f"a model needs every parameter; missing {sorted(missing)}")
    checked, per_element = {}, []
    for name, value in values.items():
        spec = SPEC_BY_NAME[name]
        try:
            arr = np.atleast_1d(np.asarray(value, dtype=np.float64))
        except (TypeError, ValueError):
            raise ParameterError("non_numeric", f"{name}: not numbers") from None
        count = element_count(robot, name)
        if arr.ndim != 1 or arr.size not in (1, count):
            raise ParameterError("wrong_length", f"{name}: {arr.size} values, expected 1 or {count}")
        if not np.isfinite(arr).all():
            raise ParameterError("non_finite", f"{name}: non-finite value")
        lo, hi = bounds.get(name, (spec.lower, spec.upper))
        if not (spec.lower <= lo < hi <= spec.upper):
            raise ParameterError("bad_bounds", f"{name}: bounds {(lo, hi)} outside [{spec.lower}, {spec.upper}]")
        if (math.log(hi / lo) if spec.log_scale else (hi - lo) / (spec.upper - spec.lower)) < 1e-9:
            raise ParameterError("bad_bounds", f"{name}: bounds {(lo, hi)} too narrow to represent")
        if not ((arr > lo) & (arr < hi)).all():
            raise ParameterError("out_of_bounds", f"{name}={arr.tolist()} outside ({lo}, {hi}) {spec.unit}")
        checked[name] = arr
        if arr.size > 1:
            per_element.append(name)
    try:
        params = PhysicalParameters(robot, values=checked, per_element=per_element, bounds=bounds)
    except ValueError as exc:         # a value on a bound after rounding to the raw scale
        raise ParameterError("out_of_bounds", str(exc)) from None
    if not all(np.isfinite(v).all() for v in params.as_dict().values()):
        raise ParameterError("non_finite", "values not representable within their bounds")
    return params


def load_representable(name_or_path) -> RobotConfig:
    """`config.load_robot`, refusing (`ConfigError`, naming it) a value the engine cannot
    represent (outside its parameter ranges, `PARAM_SPECS`): every model of the robot
    would otherwise fail on it later, in the middle of a run (`held_inside`)."""
    robot = load_robot(name_or_path)
    try:
        PhysicalParameters(robot)
    except ValueError as exc:
        raise ConfigError(f"{robot.source}: {exc}") from None
    return robot


def held_inside(spec: ParamSpec, configured) -> np.ndarray:
    """A robot config's values of ``spec`` just inside its bounds where they lie on one (a
    slack share of 1) or are zero below a positive lower end ("none": no torsional friction,
    no damping): raw values exist only strictly inside. A value further outside is a
    ValueError naming it: clipped, the engine would model another robot than the config's
    (its MuJoCo twin plays the config)."""
    v = np.asarray(configured, dtype=np.float64)
    plo, phi = SPEC_BY_NAME[spec.name].lower, SPEC_BY_NAME[spec.name].upper     # the project's range
    ok = np.isfinite(v) & (((v >= plo) & (v <= phi)) | ((v == 0.0) & (plo > 0)))
    if not ok.all():
        raise ValueError(f"{spec.name} = {v[~ok][:4].tolist()} in the robot config is outside the range the "
                         f"engine represents [{plo:g}, {phi:g}] {spec.unit}")
    lo, hi = spec.lower, spec.upper                     # a caller's narrower bounds hold it inside them
    return np.clip(v, lo + 1e-6 * abs(lo), hi - 1e-6 * abs(hi))


def checked_bounds(spec: ParamSpec, lower, upper) -> tuple[float, float]:
    """(lower, upper) as floats if they are a range ``spec``'s reparameterisation can map
    (finite, lower < upper, lower > 0 on a log scale); ValueError otherwise (a config's or a
    checkpoint file's bounds: a NaN or an infinite end makes every value NaN)."""
    try:
        lo, hi = float(lower), float(upper)
    except (TypeError, ValueError):
        raise ValueError(f"bounds for {spec.name}: need two numbers, got {str((lower, upper))[:80]}") from None
    if not (math.isfinite(lo) and math.isfinite(hi) and lo < hi) or (spec.log_scale and lo <= 0):
        raise ValueError(f"bounds for {spec.name}: need finite {'0 < ' if spec.log_scale else ''}lower < upper, "
                         f"got {(lo, hi)}")
    return lo, hi


class PhysicalParameters(nn.Module):
    """All identifiable parameters of one robot, bounded by reparameterisation.

    ``per_element`` names the parameters that get one value per cable/rod; all others
    are shared (one value broadcast over cables/rods), the paper's default.
    ``learnable`` restricts which raw tensors require grad (the rest stay fixed).

    A shared cable or rod parameter whose config values differ between elements (weighed
    rods, one carrying a payload; cables of two kinds) keeps the config's *profile*: its
    one raw value is the mean over the elements and each element is that mean times its
    config value over the config's mean. So the config's distribution is never averaged
    away, and learning the shared value scales all elements together. The mean is bounded
    so that every element stays within the parameter's bounds.
    """

    def __init__(self, robot: RobotConfig, values: Mapping[str, np.ndarray | float] | None = None,
                 *, per_element: Iterable[str] = (), learnable: Iterable[str] | None = None,
                 bounds: Mapping[str, tuple[float, float]] | None = None,
                 dtype: torch.dtype = torch.float64):
        super().__init__()
        self.robot = robot
        self.per_element = frozenset(per_element)
        unknown = (self.per_element | set(bounds or {}) | set(learnable or ())) - set(SPEC_BY_NAME)
        if unknown:
            raise ValueError(f"unknown parameter name(s): {sorted(unknown)}")
        self.specs = {}
        for spec in PARAM_SPECS:
            lo, hi = checked_bounds(spec, *(bounds or {}).get(spec.name, (spec.lower, spec.upper)))
            self.specs[spec.name] = dataclasses.replace(spec, lower=lo, upper=hi)
        configured = nominal_values(robot)
        start = {n: v if values is not None and n in values else held_inside(self.specs[n], v)
                 for n, v in configured.items()}
        if values is not None:
            start.update({k: np.atleast_1d(np.asarray(v, dtype=np.float64)) for k, v in values.items()})
        learnable = set(SPEC_BY_NAME) if learnable is None else set(learnable)
        self.profiled: frozenset = frozenset()
        self._profile_range: dict[str, tuple[float, float]] = {}     # (min, max): no device sync
        for name, spec in self.specs.items():
            shaped = None if name in self.per_element else self._config_profile(name, configured[name])
            if shaped is not None:
                inside, profile = shaped
                self.register_buffer(f"profile_{name}", torch.as_tensor(profile, dtype=dtype), persistent=False)
                self.profiled |= {name}
                self._profile_range[name] = (float(profile.min()), float(profile.max()))
                if values is None or name not in values:
                    start[name] = inside
            size = self._size(name)
            value = np.broadcast_to(np.atleast_1d(start[name]), (self._full_size(name),))
            value = value.mean(keepdims=True) if size == 1 else value.copy()
            raw = self._to_raw(self.raw_spec(name), torch.as_tensor(value, dtype=dtype))
            self.register_parameter(name, nn.Parameter(raw, requires_grad=name in learnable))

    @classmethod
    def keeping_elements(cls, robot: RobotConfig, values: Mapping[str, object] | None = None,
                         **kwargs) -> "PhysicalParameters":
        """Like the constructor, but every name whose values differ between cables / rods (in
        ``values`` or, for names not given, in the robot's config) stays per element instead
        of being averaged: the exact model of a config or of a published parameter set."""
        merged = nominal_values(robot)
        merged.update({k: np.atleast_1d(np.asarray(v, dtype=np.float64)) for k, v in (values or {}).items()})
        varying = [k for k, v in merged.items() if np.size(v) > 1 and np.ptp(v) > 0]
        return cls(robot, values, per_element=set(kwargs.pop("per_element", ())) | set(varying), **kwargs)

    def _config_profile(self, name: str, configured) -> Optional[tuple[np.ndarray, np.ndarray]]:
        """(config values held just inside the bounds, over their mean) where they differ
        between elements, else None. A config value on a bound (a slack share of 1) has no
        raw value; 1e-6 inside it has, as a per-element value would need."""
        spec = self.specs[name]
        if spec.group == "global":
            return None
        full = np.broadcast_to(np.atleast_1d(np.asarray(configured, dtype=np.float64)),
                               (self._full_size(name),))
        inside = held_inside(spec, full)
        mean = float(inside.mean())
        if not (mean > 0 and np.isfinite(inside).all()) or np.ptp(inside) <= 1e-12 * abs(mean):
            return None
        profile = inside / mean
        if not spec.lower / profile.min() < spec.upper / profile.max():
            raise ValueError(f"{name}: the config's values span {profile.max() / profile.min():.3g}x, wider "
                             f"than its bounds [{spec.lower}, {spec.upper}]")
        return inside, profile

    def raw_spec(self, name: str) -> ParamSpec:
        """The bounds the raw value maps into: a profiled parameter's mean is bounded so that
        every element stays within the parameter's bounds (`bounds_of`)."""
        spec = self.specs[name]
        if name not in self.profiled:
            return spec
        low, high = self._profile_range[name]
        return dataclasses.replace(spec, lower=spec.lower / low, upper=spec.upper / high)

    def profile(self, name: str) -> Optional[torch.Tensor]:
        """The config's per-element profile of a shared parameter (`profiled`), else None."""
        return getattr(self, f"profile_{name}") if name in self.profiled else None

    def _shaped(self, name: str, value: torch.Tensor) -> torch.Tensor:
        profile = self.profile(name)
        return value if profile is None else value * profile.to(value.dtype)

    # ------------------------------------------------------------------ shapes
    def _full_size(self, name: str) -> int:
        group = self.specs[name].group
        return {"cable": self.robot.num_cables, "rod": self.robot.num_rods, "global": 1}[group]

    def _size(self, name: str) -> int:
        return self._full_size(name) if name in self.per_element else 1

    # ------------------------------------------------------------------ transform
    @staticmethod
    def _to_raw(spec: ParamSpec, value: torch.Tensor) -> torch.Tensor:
        lo, hi = spec.lower, spec.upper
        if spec.log_scale:
            frac = (torch.log(value) - math.log(lo)) / (math.log(hi) - math.log(lo))
        else:
            frac = (value - lo) / (hi - lo)
        # NaN (a NaN value, or bounds too narrow to resolve) is outside too
        if bool((~torch.isfinite(frac) | (frac <= 0) | (frac >= 1)).any()):
            raise ValueError(f"{spec.name}={value.tolist()} lies outside its bounds [{lo}, {hi}]")
        return torch.logit(frac)

    @staticmethod
    def _from_raw(spec: ParamSpec, raw: torch.Tensor) -> torch.Tensor:
        frac = torch.sigmoid(raw)
        if spec.log_scale:
            return torch.exp(math.log(spec.lower) + (math.log(spec.upper) - math.log(spec.lower)) * frac)
        return spec.lower + (spec.upper - spec.lower) * frac

    def value(self, name: str) -> torch.Tensor:
        """Constrained value, shape (1,) if shared or (C,)/(R,) if per element or profiled."""
        return self._shaped(name, self.shared_value(name))

    def shared_value(self, name: str) -> torch.Tensor:
        """The value its raw tensor holds: a profiled parameter's mean over its elements."""
        return self._from_raw(self.raw_spec(name), getattr(self, name))

    def values(self) -> dict[str, torch.Tensor]:
        return {name: self.value(name) for name in self.specs}

    def values_with(self, raw: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """`values` with the raw tensors of ``raw`` in place of the module's own: a functional
        view (forward-mode Jacobians through ``torch.func``), the module is left untouched."""
        return {name: self._shaped(name, self._from_raw(self.raw_spec(name), raw[name] if name in raw
                                                        else getattr(self, name)))
                for name in self.specs}

    def full(self, name: str) -> torch.Tensor:
        """Value broadcast to one entry per cable/rod (or (1,) for globals)."""
        v = self.value(name)
        return v.expand(self._full_size(name))

    @torch.no_grad()
    def set_value(self, name: str, value) -> None:
        raw = getattr(self, name)
        target = torch.as_tensor(np.asarray(value, dtype=np.float64), dtype=raw.dtype, device=raw.device)
        target = target.expand(self._full_size(name)) if target.numel() == 1 else target
        if raw.numel() == 1:
            target = target.mean(dim=0, keepdim=True)
        spec = self.raw_spec(name)
        if name in self.profiled and not bool(((target > spec.lower) & (target < spec.upper)).all()):
            raise ValueError(f"{name}: a mean of {float(target[0]):.6g} puts an element outside the bounds "
                             f"{self.bounds_of(name)}; with the config's profile it must lie in "
                             f"({spec.lower:.6g}, {spec.upper:.6g})")
        raw.copy_(self._to_raw(spec, target))

    def as_dict(self) -> dict[str, list[float]]:
        """Plain floats (for YAML, messages and logs)."""
        return {name: v.detach().cpu().double().tolist() for name, v in self.values().items()}

    def flat(self) -> tuple[list[str], np.ndarray]:
        """Names like ``cable_stiffness[3]`` (or ``cable_stiffness`` if shared) and values."""
        names, vals = [], []
        for name, v in self.values().items():
            v = v.detach().cpu().double().numpy()
            if v.size == 1:
                names.append(name)
                vals.append(float(v[0]))
            else:
                names.extend(f"{name}[{i}]" for i in range(v.size))
                vals.extend(v.tolist())
        return names, np.array(vals)

    def bounds_of(self, name: str) -> tuple[float, float]:
        spec = self.specs[name]
        return spec.lower, spec.upper

    @torch.no_grad()
    def narrow_upper_bound(self, name: str, upper: float) -> bool:
        """Lower the upper bound of ``name`` to ``upper`` (never widen it), keeping the value:
        one above the new bound moves to half of it (or between the bounds if they are close).
        Returns whether the value had to move."""
        if name in self.profiled:
            raise ValueError(f"{name}: the bound of a profiled parameter's elements cannot be narrowed")
        spec = self.specs[name]
        upper = min(float(upper), spec.upper)
        if not upper > spec.lower * 1.01:
            raise ValueError(f"{name}: upper bound {upper} at or too close to the lower bound {spec.lower}")
        value = self.shared_value(name)
        self.specs[name] = dataclasses.replace(spec, upper=upper)
        over = value >= upper * (1.0 - 1e-9)
        inside = torch.where(over, torch.full_like(value, math.sqrt(upper * spec.lower)
                                                   if upper < 2.0 * spec.lower else upper / 2.0), value)
        getattr(self, name).copy_(self._to_raw(self.specs[name], inside))
        moved = bool(over.any())
        return moved

    def randomize(self, generator: np.random.Generator, names: Iterable[str] | None = None,
                  margin: float = 0.05) -> None:
        """Random start inside the bounds (log-uniform for log-scale parameters).

        ``margin`` keeps the start away from the saturating ends of the sigmoid.
        """
        names = list(self.specs) if names is None else list(names)
        with torch.no_grad():
            for name in names:
                raw = getattr(self, name)
                frac = generator.uniform(margin, 1.0 - margin, size=raw.shape)
                raw.copy_(torch.logit(torch.as_tensor(frac, dtype=raw.dtype)))

    def to_robot_config(self) -> RobotConfig:
        """A RobotConfig carrying these values (for YAML export and the MuJoCo twin)."""
        from tensegrity_engine.physics.config import Friction

        v = {k: np.asarray(x) for k, x in self.as_dict().items()}
        r = self.robot
        return r.replace(
            cable_stiffness=np.broadcast_to(v["cable_stiffness"], (r.num_cables,)).copy(),
            cable_damping=np.broadcast_to(v["cable_damping"], (r.num_cables,)).copy(),
            cable_slack_damping=np.broadcast_to(v["cable_slack_damping"], (r.num_cables,)).copy(),
            rod_mass=np.broadcast_to(v["rod_mass"], (r.num_rods,)).copy(),
            rod_inertia_factor=np.broadcast_to(v["rod_inertia_factor"], (r.num_rods,)).copy(),
            # the robot's own actuator with the identified values (its safety limit kept)
            actuator=dataclasses.replace(r.actuator, time_constant=float(v["actuator_time_constant"][0]),
                                         gain=float(v["actuator_gain"][0]), offset=float(v["actuator_offset"][0]),
                                         max_speed=float(v["actuator_max_speed"][0]),
                                         delay=float(v["actuator_delay"][0])),
            contact=dataclasses.replace(
                r.contact, stiffness=float(v["contact_stiffness"][0]), damping=float(v["contact_damping"][0]),
                friction=Friction(float(v["friction_sliding"][0]), float(v["friction_torsional"][0]),
                                  float(v["friction_rolling"][0])),
                solref=(float(v["contact_time_constant"][0]), float(v["contact_damping_ratio"][0]))),
        )
