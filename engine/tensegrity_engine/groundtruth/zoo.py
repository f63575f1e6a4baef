"""The robot zoo: ground truths that are not the engine, built from any robot config.

A zoo entry (``config/zoo.yaml``) scales a robot config's values far from nominal and picks
a `Realisation` and a `SensorModel`; `zoo_robot(name, base)` applies it to ``base`` (any
topology). The result carries the base (nominal) config, the true config and how MuJoCo
realises it; benches compare identified values with `ZooRobot.true_values`, which the
identification never sees.

The file's ``twins`` are entries of the same form without realisation and sensing: the
engine's own equations with values far from the config's (``twin/<name>``, `twin_robot`),
for the sim2sim and for checks of the solver alone; `zoo_names` lists the robots only.
"""
from __future__ import annotations

import dataclasses
import math
import zlib
from pathlib import Path
from typing import Optional, Sequence

import numpy as np
import yaml

from tensegrity_engine.groundtruth.mujoco_twin import MujocoTwin
from tensegrity_engine.groundtruth.random_robots import RANDOM_PREFIX, random_entry
from tensegrity_engine.groundtruth.realisation import Realisation, rod_inertia
from tensegrity_engine.groundtruth.sensors import SensorModel
from tensegrity_engine.physics.config import (CONFIG_DIR, DEFAULT_MAX_SPEED, ActuatorConfig, ConfigError, RobotConfig,
                                             load_robot, topology_fingerprint)

__all__ = ["ZooRobot", "MUJOCO_DEFAULT_SOLREF", "zoo_names", "zoo_robot", "twin_names", "twin_robot", "ground_truth",
           "random_robot", "ZOO_FILE", "ZOO_PREFIX", "TWIN_PREFIX", "RANDOM_PREFIX"]

ZOO_FILE = CONFIG_DIR / "zoo.yaml"
ZOO_PREFIX = "zoo/"
TWIN_PREFIX = "twin/"
SCALED = ("cable_stiffness", "cable_damping", "rod_mass", "actuator_time_constant")
ENTRY_KEYS = {"description", "scale", "friction_sliding", "cable_spread", "payload", "radius_scale",
              "realisation", "sensing"}


# MuJoCo's solref where a model sets none: (time constant s, damping ratio)
MUJOCO_DEFAULT_SOLREF = (0.02, 1.0)


@dataclasses.dataclass(frozen=True)
class ZooRobot:
    name: str
    description: str
    nominal: RobotConfig          # what the user knows: topology and config values
    truth: RobotConfig            # the values MuJoCo runs
    realisation: Realisation
    sensing: SensorModel

    def twin(self, *, floor: bool = True, fixed_rods: Sequence[int] = (), nthread: int = 2) -> MujocoTwin:
        return MujocoTwin(self.truth, floor=floor, fixed_rods=fixed_rods, nthread=nthread,
                          realisation=self.realisation)

    def weighed(self) -> RobotConfig:
        """The model the robot's builder has: the nominal config with the rods' masses (a
        scale gives them, a payload included) and capsule radii (a ruler); nothing else of
        the truth (how the mass lies along a rod, the cables, motors and contacts are what
        identification is for)."""
        return self.nominal.replace(rod_mass=self.truth.rod_mass.copy(), rod_radius=self.truth.rod_radius.copy())

    def inertia_factor(self) -> np.ndarray:
        """(R,) the robot's transverse inertia over a uniform rod's (the engine's
        ``rod_inertia_factor``), end-heavy realisations included."""
        t, f = self.truth, self.realisation.end_mass_fraction
        if f == 0.0:
            return t.rod_inertia_factor.copy()
        return rod_inertia(t.rod_mass, t.rod_radius, t.rod_length, f)[:, 0] / t.uniform_rod_inertia()[:, 0]

    def max_speed(self) -> float:
        """Top speed of the filtered command (the engine's ``actuator_max_speed``): a motor
        realisation's winch speed over the gain (its dead band has no engine value)."""
        a = self.realisation.actuation
        if a.kind == "motor" and math.isfinite(a.max_speed):
            return a.max_speed / self.truth.actuator.gain
        return self.truth.actuator.max_speed

    def true_values(self, *, sensed: bool = False) -> dict[str, np.ndarray]:
        """True value of every parameter that has one in this realisation (per cable / rod).
        ``sensed``: the data comes through the robot's sensor model, whose latency is then
        part of the delay the pose stamps see (``actuator_delay``)."""
        t = self.truth
        # all the damping on slack cables too: 1, held just inside the parameter's bound
        slack = np.full(t.num_cables, 1.0 - 1e-6) if self.realisation.slack_damping else t.cable_slack_damping.copy()
        return {"cable_stiffness": t.cable_stiffness.copy(), "cable_damping": t.cable_damping.copy(),
                "cable_slack_damping": slack,
                "rod_mass": t.rod_mass.copy(), "rod_inertia_factor": self.inertia_factor(),
                "actuator_time_constant": np.array([t.actuator.time_constant]),
                "actuator_max_speed": np.array([self.max_speed()]),
                "actuator_delay": np.array([t.actuator.delay + (self.sensing.latency if sensed else 0.0)]),
                "actuator_gain": np.array([t.actuator.gain]),
                "actuator_offset": np.array([t.actuator.offset]),
                "friction_sliding": np.array([t.contact.friction.sliding])}

    def true_contact(self) -> dict[str, np.ndarray]:
        """The robot's ground contact in the soft law's values (MuJoCo's solref: the
        realisation's own, else MuJoCo's default) and its sliding friction: what a model
        under the soft law is compared with. The penalty law's stiffness and damping have no
        MuJoCo counterpart. Not in `true_values`: a zoo robot's contact is MuJoCo's, which
        the engine's soft law approximates (its condim, cone and solimp may differ), so a
        model keeps its fitted contact where true values are scored in it."""
        solref = self.realisation.contact.solref or MUJOCO_DEFAULT_SOLREF
        return {"contact_time_constant": np.array([float(solref[0])]),
                "contact_damping_ratio": np.array([float(solref[1])]),
                "friction_sliding": np.array([self.truth.contact.friction.sliding])}


def _entries(path: Optional[Path], section: str = "robots") -> dict:
    path = Path(path) if path is not None else ZOO_FILE
    try:
        data = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError) as err:
        raise ConfigError(f"{path}: cannot read the zoo: {err}") from None
    entries = (data or {}).get(section)
    if section == "robots" and (not isinstance(entries, dict) or not entries):
        raise ConfigError(f"{path}: needs a non-empty 'robots' mapping")
    if entries is not None and not isinstance(entries, dict):
        raise ConfigError(f"{path}: '{section}' must be a mapping")
    return entries or {}


def zoo_names(path: Optional[Path] = None) -> list[str]:
    return list(_entries(path))


def twin_names(path: Optional[Path] = None) -> list[str]:
    return list(_entries(path, "twins"))


def _factor(value, where: str) -> float:
    try:
        f = float(value)
    except (TypeError, ValueError):
        raise ConfigError(f"{where}: not a number: {value!r}") from None
    if not (np.isfinite(f) and f > 0):
        raise ConfigError(f"{where}: must be a finite number > 0, got {f}")
    return f


def zoo_robot(name: str, base: RobotConfig | str, path: Optional[Path] = None) -> ZooRobot:
    """The zoo entry ``name`` applied to ``base`` (a config or its name/path)."""
    return _entry_robot(name, base, path, twin=False)


def twin_robot(name: str, base: RobotConfig | str, path: Optional[Path] = None) -> ZooRobot:
    """The ``twins`` entry ``name`` applied to ``base``: its values, the engine's own
    equations (`Realisation.twin_of`), an ideal mocap."""
    return _entry_robot(name, base, path, twin=True)


def _entry_robot(name: str, base: RobotConfig | str, path: Optional[Path], twin: bool) -> ZooRobot:
    entries = _entries(path, "twins" if twin else "robots")
    if name not in entries:
        raise ConfigError(f"no {'twin' if twin else 'zoo robot'} {name!r}; known: {sorted(entries)}")
    where = f"{TWIN_PREFIX if twin else ZOO_PREFIX}{name}"
    return _robot_of_entry(dict(entries[name] or {}), where, where if twin else name, name, base, twin)


def random_robot(seed: int, base: RobotConfig | str) -> ZooRobot:
    """The robot `random_robots.random_entry` draws from ``seed``, applied to ``base``."""
    where = f"{RANDOM_PREFIX}{int(seed)}"
    return _robot_of_entry(random_entry(int(seed)), where, where, where, base, twin=False)


def _robot_of_entry(e: dict, where: str, name: str, key: str, base: RobotConfig | str, twin: bool) -> ZooRobot:
    """Entry ``e`` applied to ``base``: ``where`` names it in errors, ``name`` in the result;
    ``key`` seeds its cable spread (the entry's own name: the same robot on every run)."""
    base = load_robot(base) if not isinstance(base, RobotConfig) else base
    unknown = set(e) - (ENTRY_KEYS - {"realisation", "sensing"} if twin else ENTRY_KEYS)
    if unknown:
        raise ConfigError(f"{where}: unknown key(s) {sorted(unknown)}")
    scale = dict(e.get("scale") or {})
    if set(scale) - set(SCALED):
        raise ConfigError(f"{where}: scale may name only {SCALED}, got {sorted(scale)}")
    f = {k: _factor(scale.get(k, 1.0), f"{where}.scale.{k}") for k in SCALED}
    # Seeded by the name alone: the same robot on every machine and every run.
    rng = np.random.default_rng(zlib.crc32(key.encode()))
    spread = float(e.get("cable_spread", 0.0))
    if not 0.0 <= spread < 1.0:
        raise ConfigError(f"{where}.cable_spread must be in [0, 1), got {spread}")
    C = base.num_cables
    stiffness = base.cable_stiffness * f["cable_stiffness"] * rng.uniform(1 - spread, 1 + spread, C)
    damping = base.cable_damping * f["cable_damping"] * rng.uniform(1 - spread, 1 + spread, C)
    mass = base.rod_mass * f["rod_mass"]
    if e.get("payload"):
        p = dict(e["payload"])
        rod = int(p["rod"]) % base.num_rods
        mass = mass.copy()
        mass[rod] += _factor(p["mass_fraction"], f"{where}.payload.mass_fraction") * base.rod_mass[rod]
    friction = base.contact.friction
    if "friction_sliding" in e:
        friction = dataclasses.replace(friction, sliding=_factor(e["friction_sliding"], f"{where}.friction_sliding"))
    try:
        realisation = None if twin else Realisation.from_dict(e.get("realisation") or {})
        sensing = SensorModel(**{k: float(v) for k, v in (e.get("sensing") or {}).items()})
    except (TypeError, ValueError) as err:
        raise ConfigError(f"{where}: {err}") from None
    # the base's winch limit is the robot's where its filter is the engine's (a twin of a
    # limited robot is limited); a stepped actuation has its own (`Actuation.max_speed`).
    # The declared delay and command-rate limit are the mocap's and the controller's.
    stepped = realisation is not None and realisation.actuation.stepped
    truth = base.replace(
        name=f"{base.name}@{name}", source=f"{where} of {base.source}",
        cable_stiffness=stiffness, cable_damping=damping, rod_mass=mass,
        rod_radius=base.rod_radius * _factor(e.get("radius_scale", 1.0), f"{where}.radius_scale"),
        actuator=ActuatorConfig(time_constant=base.actuator.time_constant * f["actuator_time_constant"],
                                gain=base.actuator.gain, offset=base.actuator.offset,
                                max_speed=DEFAULT_MAX_SPEED if stepped else base.actuator.max_speed),
        contact=dataclasses.replace(base.contact, friction=friction))
    if realisation is None:
        realisation = Realisation.twin_of(truth)
    return ZooRobot(name=name, description=str(e.get("description", "")), nominal=base,
                    truth=truth, realisation=realisation, sensing=sensing)


def ground_truth(spec: str, base: RobotConfig) -> ZooRobot:
    """``zoo/<name>`` (a zoo entry applied to ``base``), ``twin`` (the engine's twin of
    ``base``), ``twin/<name>`` (a twins entry: the engine's twin with values far from
    ``base``'s), ``random/<seed>`` (a robot drawn from the seed, `random_robots`), or a
    robot-config YAML path (its values, realised as the twin). The topology must be
    ``base``'s."""
    if spec.startswith(ZOO_PREFIX):
        return zoo_robot(spec[len(ZOO_PREFIX):], base)
    if spec.startswith(TWIN_PREFIX):
        return twin_robot(spec[len(TWIN_PREFIX):], base)
    if spec.startswith(RANDOM_PREFIX):
        seed = spec[len(RANDOM_PREFIX):]
        if not seed.isdigit():
            raise ConfigError(f"{spec!r}: a drawn robot is random/<seed>, the seed a whole number >= 0")
        return random_robot(int(seed), base)
    truth = base if spec in ("", "twin") else load_robot(spec)
    if topology_fingerprint(truth) != topology_fingerprint(base):
        raise ConfigError(f"ground truth {spec!r} has another topology than {base.name!r}")
    if truth.dt != base.dt:
        raise ConfigError(f"ground truth {spec!r} steps at {truth.dt} s, {base.name!r} at {base.dt} s")
    return ZooRobot(name=spec or "twin", description="the engine's twin", nominal=base, truth=truth,
                    realisation=Realisation.twin_of(truth), sensing=SensorModel())
