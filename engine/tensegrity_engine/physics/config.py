"""Robot description loaded from one YAML file (the single source of truth).

Both the differentiable engine and the MuJoCo twin are built from a `RobotConfig`.
Every validation error names the offending field, e.g. ``cables[3].ends``.
"""
from __future__ import annotations

import dataclasses
import difflib
import math
import os
from pathlib import Path
from typing import Any, Mapping, Optional

import numpy as np
import yaml

CONFIG_DIR = Path(__file__).resolve().parents[3] / "config"   # <repo>/config
DEFAULT_SLACK_DAMPING = 1e-3    # cables.slack_damping when a config leaves it out
DEFAULT_MAX_SPEED = 1e3         # actuator.max_speed (m/s) when a config leaves it out: no limit


class ConfigError(ValueError):
    """A robot config is malformed; the message names the field."""


@dataclasses.dataclass(frozen=True)
class Friction:
    sliding: float
    torsional: float
    rolling: float


# Ground contact laws (`physics.soft_contact`): the paper's penalty spring-damper with smooth
# Coulomb friction, or MuJoCo's soft constraint (pyramidal friction cone, solref/solimp).
CONTACT_LAWS = ("penalty", "soft")
DEFAULT_SOLREF = (0.02, 1.0)                        # MuJoCo's defaults: time constant (s), damping ratio
DEFAULT_SOLIMP = (0.9, 0.95, 0.001, 0.5, 2.0)       # dmin, dmax, width (m), midpoint, power


@dataclasses.dataclass(frozen=True)
class ContactConfig:
    ground_height: float
    rod_rod: bool
    stiffness: float                 # penalty law (ground and rod pairs)
    damping: float
    friction: Friction
    law: str = "penalty"             # ground contact law, one of CONTACT_LAWS
    solref: tuple = DEFAULT_SOLREF   # soft law: (time constant s, damping ratio)
    solimp: tuple = DEFAULT_SOLIMP   # soft law: impedance (dmin, dmax, width m, midpoint, power)
    condim: int = 0                  # soft law: 1 (frictionless), 3 (sliding), 4 (+ torsional),
                                     # 6 (+ rolling); 0: 6 if torsional or rolling friction is set, else 3

    @property
    def soft_condim(self) -> int:
        if self.condim:
            return self.condim
        return 6 if (self.friction.torsional > 0 or self.friction.rolling > 0) else 3


# The integrators a robot model may be stepped with (`physics.integrators`): explicit cable
# damping, damping and gyroscopic terms implicit per rod (MuJoCo's ``implicitfast``), or
# four Runge-Kutta stages (MuJoCo's ``RK4``).
MODEL_INTEGRATORS = ("semi_implicit", "implicitfast", "rk4")
# The MuJoCo integrator of each (`groundtruth.realisation`, `export.mjcf`)
MUJOCO_INTEGRATORS = {"semi_implicit": "Euler", "implicitfast": "implicitfast", "rk4": "RK4"}


@dataclasses.dataclass(frozen=True)
class ActuatorConfig:
    time_constant: float
    gain: float
    offset: float
    # Top speed of the filtered command (m/s in command units; the winch's cable speed over
    # the gain). The default never binds within any command range (tau * speed >= 2 m).
    max_speed: float = DEFAULT_MAX_SPEED
    # s a command takes to act, as the pose stamps see it: motor dead time plus the mocap's
    # latency (negative: a pose clock ahead of the command clock).
    delay: float = 0.0
    # Fastest change of the *commanded* target a controller may send (m/s in command
    # units); a safety limit for hardware, not a model of it (that is max_speed).
    max_command_rate: float = math.inf


@dataclasses.dataclass(frozen=True)
class RobotConfig:
    """Numeric view of the robot. Arrays are float64 numpy; rods R, cables C."""

    name: str
    gravity: np.ndarray            # (3,)
    dt: float
    rod_names: tuple[str, ...]
    rod_end_nodes: np.ndarray      # (R, 2, 3) initial end-node positions, world frame
    rod_mass: np.ndarray           # (R,)
    rod_radius: np.ndarray         # (R,)
    rod_length: np.ndarray         # (R,)
    cable_names: tuple[str, ...]
    cable_ends: np.ndarray         # (C, 2, 2) int: [[rod, end], [rod, end]]
    cable_rest_length: np.ndarray  # (C,)
    cable_stiffness: np.ndarray    # (C,)
    cable_damping: np.ndarray      # (C,)
    cable_actuated: np.ndarray     # (C,) bool
    cable_command_range: np.ndarray  # (C, 2) metres
    actuator: ActuatorConfig
    contact: ContactConfig
    source: str = "<dict>"
    # Transverse inertia over that of a uniform solid rod (R,): 1 uniform, 1 + 2f with a
    # fraction f of the mass at the ends (SUPERball's motors and batteries). None: all 1.
    rod_inertia_factor: Optional[np.ndarray] = None
    # Share of the cable damping acting whether the cable is taut or slack (C,): a tendon
    # damper (cable through a housing, elastic cord) rather than a damped spring that only
    # acts while it pulls. Zero is not representable by the bounded parameter, so "none"
    # is its default, 1e-3. None: that default.
    cable_slack_damping: Optional[np.ndarray] = None
    # How the model steps (a structure, chosen like a parameter, see `MODEL_INTEGRATORS`).
    integrator: str = "semi_implicit"

    def __post_init__(self):
        if self.integrator not in MODEL_INTEGRATORS:
            raise ConfigError(f"engine.integrator must be one of {MODEL_INTEGRATORS}, got {self.integrator!r}")
        for name, count, default in (("rod_inertia_factor", len(self.rod_names), 1.0),
                                     ("cable_slack_damping", len(self.cable_names), DEFAULT_SLACK_DAMPING)):
            value = getattr(self, name)
            value = np.full(count, default) if value is None else \
                np.broadcast_to(np.asarray(value, dtype=np.float64), (count,)).copy()
            object.__setattr__(self, name, value)

    @property
    def num_rods(self) -> int:
        return len(self.rod_names)

    @property
    def num_cables(self) -> int:
        return len(self.cable_names)

    @property
    def actuated_indices(self) -> np.ndarray:
        return np.flatnonzero(self.cable_actuated)

    @property
    def num_actuated(self) -> int:
        return int(self.cable_actuated.sum())

    @property
    def cable_node_index(self) -> np.ndarray:
        """(C, 2) flat node index 2 * rod + end of each cable end."""
        return self.cable_ends[..., 0] * 2 + self.cable_ends[..., 1]

    @property
    def command_low(self) -> np.ndarray:
        return self.cable_command_range[self.actuated_indices, 0]

    @property
    def command_high(self) -> np.ndarray:
        return self.cable_command_range[self.actuated_indices, 1]

    @property
    def rod_centers(self) -> np.ndarray:
        return self.rod_end_nodes.mean(axis=1)

    def rod_inertia(self) -> np.ndarray:
        """(R, 3) principal inertia (Ixx, Iyy, Izz) about the centre, z = rod axis.

        A solid cylinder of the rod's length and radius, its transverse inertia times
        ``rod_inertia_factor``: the model the engine and the MuJoCo twin share.
        """
        uniform = self.uniform_rod_inertia()
        return uniform * np.stack([self.rod_inertia_factor, self.rod_inertia_factor,
                                   np.ones_like(self.rod_inertia_factor)], axis=-1)

    def uniform_rod_inertia(self) -> np.ndarray:
        """(R, 3) principal inertia of uniform solid cylinders (``rod_inertia_factor`` 1)."""
        m, r, L = self.rod_mass, self.rod_radius, self.rod_length
        transverse = m * (3.0 * r**2 + L**2) / 12.0
        axial = 0.5 * m * r**2
        return np.stack([transverse, transverse, axial], axis=-1)

    def replace(self, **changes: Any) -> "RobotConfig":
        return dataclasses.replace(self, **changes)


# --------------------------------------------------------------------------- parsing
# The keys each mapping of a robot YAML may have: anything else is a typo that would
# otherwise leave a value at its default without a word (``max_sped: 0.25``).
KEYS = {
    "config": ("name", "gravity", "engine", "rod_defaults", "rods", "cable_defaults", "cables", "actuator",
               "contact"),
    "engine": ("dt", "integrator"),
    "rod": ("name", "end_nodes", "mass", "radius", "length", "inertia_factor"),
    "cable": ("name", "ends", "rest_length", "stiffness", "damping", "slack_damping", "actuated",
              "command_range"),
    "actuator": ("time_constant", "gain", "offset", "max_speed", "delay", "max_command_rate"),
    "contact": ("law", "solref", "solimp", "condim", "ground_height", "rod_rod", "stiffness", "damping",
                "friction"),
    "friction": ("sliding", "torsional", "rolling"),
}


def _known_keys(mapping: Any, kind: str, where: str) -> None:
    """`ConfigError` naming every key of ``mapping`` a robot YAML's ``kind`` does not have,
    with the nearest known ones."""
    if not isinstance(mapping, Mapping):
        raise ConfigError(f"{where}: expected a mapping, got {mapping!r}")
    unknown = [str(k) for k in mapping if k not in KEYS[kind]]
    if unknown:
        hints = []
        for key in unknown:
            near = difflib.get_close_matches(key, KEYS[kind], n=1, cutoff=0.6)
            hints.append(f"{key!r}" + (f" (did you mean {near[0]!r}?)" if near else ""))
        raise ConfigError(f"{where}: unknown key {', '.join(hints)}; the keys: {', '.join(KEYS[kind])}")


def _require(mapping: Mapping[str, Any], key: str, where: str) -> Any:
    if not isinstance(mapping, Mapping):
        raise ConfigError(f"{where}: expected a mapping, got {type(mapping).__name__}")
    if key not in mapping:
        raise ConfigError(f"{where}.{key}: missing required field")
    return mapping[key]


def _number_list(value: Any, n: int, where: str) -> tuple:
    if not isinstance(value, (list, tuple)) or len(value) != n:
        raise ConfigError(f"{where}: expected a list of {n} numbers, got {value!r}")
    return tuple(_number(v, f"{where}[{i}]") for i, v in enumerate(value))


def _number(value: Any, where: str, *, positive: bool = False, nonneg: bool = False) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigError(f"{where}: expected a number, got {value!r}")
    value = float(value)
    if not math.isfinite(value):
        raise ConfigError(f"{where}: must be finite, got {value!r}")
    if positive and value <= 0:
        raise ConfigError(f"{where}: must be > 0, got {value!r}")
    if nonneg and value < 0:
        raise ConfigError(f"{where}: must be >= 0, got {value!r}")
    return value


def _vector(value: Any, n: int, where: str) -> np.ndarray:
    if not isinstance(value, (list, tuple)) or len(value) != n:
        raise ConfigError(f"{where}: expected a list of {n} numbers, got {value!r}")
    return np.array([_number(v, f"{where}[{i}]") for i, v in enumerate(value)])


def _merged(defaults: Mapping[str, Any], item: Any, where: str) -> dict:
    if not isinstance(item, Mapping):
        raise ConfigError(f"{where}: expected a mapping, got {item!r}")
    merged = dict(defaults)
    merged.update(item)
    return merged


def _parse_rods(data: Mapping[str, Any]):
    defaults = data.get("rod_defaults", {}) or {}
    _known_keys(defaults, "rod", "rod_defaults")
    rods = _require(data, "rods", "config")
    if not isinstance(rods, list) or len(rods) < 2:
        raise ConfigError("config.rods: expected a list of at least 2 rods")
    names, ends, mass, radius, length, inertia = [], [], [], [], [], []
    for i, raw in enumerate(rods):
        where = f"rods[{i}]"
        rod = _merged(defaults, raw, where)
        _known_keys(raw, "rod", where)
        names.append(str(rod.get("name", f"rod_{i}")))
        nodes = _require(rod, "end_nodes", where)
        if not isinstance(nodes, list) or len(nodes) != 2:
            raise ConfigError(f"{where}.end_nodes: expected 2 points, got {nodes!r}")
        pts = np.stack([_vector(p, 3, f"{where}.end_nodes[{k}]") for k, p in enumerate(nodes)])
        span = float(np.linalg.norm(pts[1] - pts[0]))
        if span < 1e-6:
            raise ConfigError(f"{where}.end_nodes: the two end nodes coincide")
        ends.append(pts)
        mass.append(_number(_require(rod, "mass", where), f"{where}.mass", positive=True))
        radius.append(_number(_require(rod, "radius", where), f"{where}.radius", positive=True))
        inertia.append(_number(rod.get("inertia_factor", 1.0), f"{where}.inertia_factor", positive=True))
        if "length" in rod:
            declared = _number(rod["length"], f"{where}.length", positive=True)
            if abs(declared - span) > 1e-3 * max(1.0, declared):
                raise ConfigError(
                    f"{where}.length: {declared} m disagrees with the end nodes ({span:.6f} m apart)")
        length.append(span)
        if not radius[-1] < 0.5 * span:        # a radius in cm or mm: a ball, not a rod
            raise ConfigError(f"{where}.radius: {radius[-1]} m is not below half the rod's length "
                              f"({span:.4g} m between its end nodes); lengths are in metres")
    if len(set(names)) != len(names):
        raise ConfigError("config.rods: rod names must be unique")
    return tuple(names), np.stack(ends), np.array(mass), np.array(radius), np.array(length), np.array(inertia)


def _parse_cables(data: Mapping[str, Any], num_rods: int):
    defaults = data.get("cable_defaults", {}) or {}
    _known_keys(defaults, "cable", "cable_defaults")
    cables = _require(data, "cables", "config")
    if not isinstance(cables, list) or not cables:
        raise ConfigError("config.cables: expected a non-empty list of cables")
    names, ends, rest, stiff, damp, actuated, cmd_range, slack = [], [], [], [], [], [], [], []
    for i, raw in enumerate(cables):
        where = f"cables[{i}]"
        cable = _merged(defaults, raw, where)
        _known_keys(raw, "cable", where)
        names.append(str(cable.get("name", f"cable_{i}")))
        pair = _require(cable, "ends", where)
        if not isinstance(pair, list) or len(pair) != 2:
            raise ConfigError(f"{where}.ends: expected [[rod, end], [rod, end]], got {pair!r}")
        idx = []
        for k, end in enumerate(pair):
            if (not isinstance(end, list) or len(end) != 2
                    or not all(isinstance(v, int) and not isinstance(v, bool) for v in end)):
                raise ConfigError(f"{where}.ends[{k}]: expected [rod_index, end_index], got {end!r}")
            if not 0 <= end[0] < num_rods:
                raise ConfigError(f"{where}.ends[{k}]: rod index {end[0]} out of range 0..{num_rods - 1}")
            if end[1] not in (0, 1):
                raise ConfigError(f"{where}.ends[{k}]: end index must be 0 or 1, got {end[1]}")
            idx.append(end)
        if idx[0][0] == idx[1][0]:
            raise ConfigError(f"{where}.ends: a cable must join two different rods")
        ends.append(idx)
        r = _number(_require(cable, "rest_length", where), f"{where}.rest_length", positive=True)
        rest.append(r)
        stiff.append(_number(_require(cable, "stiffness", where), f"{where}.stiffness", positive=True))
        damp.append(_number(_require(cable, "damping", where), f"{where}.damping", nonneg=True))
        share = _number(cable.get("slack_damping", DEFAULT_SLACK_DAMPING), f"{where}.slack_damping", positive=True)
        if share > 1.0:
            raise ConfigError(f"{where}.slack_damping: a share of the damping, in (0, 1]; got {share}")
        slack.append(share)
        act = cable.get("actuated", False)
        if not isinstance(act, bool):
            raise ConfigError(f"{where}.actuated: expected true/false, got {act!r}")
        actuated.append(act)
        if act:
            lo, hi = _vector(_require(cable, "command_range", where), 2, f"{where}.command_range")
            if not 0 < lo < hi:
                raise ConfigError(f"{where}.command_range: need 0 < low < high, got [{lo}, {hi}]")
            if not lo <= r <= hi:
                raise ConfigError(f"{where}.rest_length: {r} m is outside command_range [{lo}, {hi}]")
        else:
            lo = hi = r
        cmd_range.append((lo, hi))
    if len(set(names)) != len(names):
        raise ConfigError("config.cables: cable names must be unique")
    if not any(actuated):       # the tuples are (poses, commands, poses); MPPI drives the commands
        raise ConfigError("config.cables: no cable is actuated (actuated: true); the robot needs one to be "
                          "commanded, identified from its commands and controlled")
    return (tuple(names), np.array(ends, dtype=np.int64), np.array(rest), np.array(stiff),
            np.array(damp), np.array(actuated, dtype=bool), np.array(cmd_range), np.array(slack))


def robot_from_dict(data: Mapping[str, Any], source: str = "<dict>") -> RobotConfig:
    if not isinstance(data, Mapping):
        raise ConfigError(f"{source}: top level must be a mapping")
    try:
        _known_keys(data, "config", "config")
        name = str(_require(data, "name", "config"))
        gravity = _vector(data.get("gravity", [0.0, 0.0, -9.81]), 3, "config.gravity")
        engine = data.get("engine", {}) or {}
        _known_keys(engine, "engine", "engine")
        dt = _number(engine.get("dt", 0.001), "engine.dt", positive=True)
        integrator = engine.get("integrator", "semi_implicit")
        if integrator not in MODEL_INTEGRATORS:
            raise ConfigError(f"engine.integrator must be one of {MODEL_INTEGRATORS}, got {integrator!r}")
        rod_names, rod_ends, mass, radius, length, inertia = _parse_rods(data)
        cable = _parse_cables(data, len(rod_names))
        act = _require(data, "actuator", "config")
        _known_keys(act, "actuator", "actuator")
        actuator = ActuatorConfig(
            time_constant=_number(_require(act, "time_constant", "actuator"),
                                  "actuator.time_constant", positive=True),
            gain=_number(act.get("gain", 1.0), "actuator.gain", positive=True),
            offset=_number(act.get("offset", 0.0), "actuator.offset"),
            max_speed=_number(act.get("max_speed", DEFAULT_MAX_SPEED), "actuator.max_speed", positive=True),
            delay=_number(act.get("delay", 0.0), "actuator.delay"),
            max_command_rate=(_number(act["max_command_rate"], "actuator.max_command_rate", positive=True)
                              if act.get("max_command_rate") is not None else math.inf),
        )
        con = _require(data, "contact", "config")
        _known_keys(con, "contact", "contact")
        fr = _require(con, "friction", "contact")
        _known_keys(fr, "friction", "contact.friction")
        rod_rod = con.get("rod_rod", True)
        if not isinstance(rod_rod, bool):
            raise ConfigError(f"contact.rod_rod: expected true/false, got {rod_rod!r}")
        law = con.get("law", "penalty")
        if law not in CONTACT_LAWS:
            raise ConfigError(f"contact.law must be one of {CONTACT_LAWS}, got {law!r}")
        solref = _number_list(con.get("solref", DEFAULT_SOLREF), 2, "contact.solref")
        if not (1e-3 < solref[0] < 1.0 and 0.05 < solref[1] < 20.0):
            raise ConfigError("contact.solref: need a time constant in (0.001, 1) s and a damping ratio in "
                              f"(0.05, 20) (the identifiable range), got {list(solref)}")
        solimp = _number_list(con.get("solimp", DEFAULT_SOLIMP), 5, "contact.solimp")
        if not (0 < solimp[0] <= solimp[1] < 1 and solimp[2] >= 0 and 0 < solimp[3] < 1 and solimp[4] >= 1):
            raise ConfigError("contact.solimp: need 0 < dmin <= dmax < 1, width >= 0, 0 < midpoint < 1, "
                              f"power >= 1; got {list(solimp)}")
        condim = con.get("condim", 0)
        if isinstance(condim, bool) or condim not in (0, 1, 3, 4, 6):      # True == 1: frictionless
            raise ConfigError(f"contact.condim must be 1, 3, 4 or 6, got {condim!r}")
        contact = ContactConfig(
            law=law, solref=solref, solimp=solimp, condim=int(condim),
            ground_height=_number(con.get("ground_height", 0.0), "contact.ground_height"),
            rod_rod=rod_rod,
            stiffness=_number(_require(con, "stiffness", "contact"), "contact.stiffness", positive=True),
            damping=_number(_require(con, "damping", "contact"), "contact.damping", nonneg=True),
            friction=Friction(
                sliding=_number(_require(fr, "sliding", "contact.friction"),
                                "contact.friction.sliding", nonneg=True),
                torsional=_number(fr.get("torsional", 0.0), "contact.friction.torsional", nonneg=True),
                rolling=_number(fr.get("rolling", 0.0), "contact.friction.rolling", nonneg=True),
            ),
        )
    except ConfigError as err:
        raise ConfigError(f"{source}: {err}") from None
    return RobotConfig(
        name=name, gravity=gravity, dt=dt, rod_names=rod_names, rod_end_nodes=rod_ends,
        rod_mass=mass, rod_radius=radius, rod_length=length,
        cable_names=cable[0], cable_ends=cable[1], cable_rest_length=cable[2],
        cable_stiffness=cable[3], cable_damping=cable[4], cable_actuated=cable[5],
        cable_command_range=cable[6], actuator=actuator, contact=contact, source=source,
        rod_inertia_factor=inertia, cable_slack_damping=cable[7], integrator=integrator,
    )


def resolve_config_path(name_or_path: str | os.PathLike) -> Path:
    """Accept a path or a bare name of a shipped config ('superball')."""
    path = Path(name_or_path)
    if path.exists():
        return path
    candidate = CONFIG_DIR / f"{name_or_path}.yaml"
    if candidate.exists():
        return candidate
    raise ConfigError(f"robot config {str(name_or_path)!r} not found (looked in {CONFIG_DIR})")


def load_robot(name_or_path: str | os.PathLike = "superball") -> RobotConfig:
    path = resolve_config_path(name_or_path)
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as err:
        raise ConfigError(f"{path}: not valid YAML: {err}") from None
    return robot_from_dict(data, source=str(path))


def robot_to_dict(robot: RobotConfig) -> dict:
    """Plain dict in this module's YAML schema (every value explicit, round-trips)."""
    rods = [{"name": n, "end_nodes": robot.rod_end_nodes[i].tolist(),
             "mass": float(robot.rod_mass[i]), "radius": float(robot.rod_radius[i])}
            | ({} if robot.rod_inertia_factor[i] == 1.0 else {"inertia_factor": float(robot.rod_inertia_factor[i])})
            for i, n in enumerate(robot.rod_names)]
    cables = []
    for c, n in enumerate(robot.cable_names):
        cab = {"name": n, "ends": robot.cable_ends[c].tolist(),
               "rest_length": float(robot.cable_rest_length[c]),
               "stiffness": float(robot.cable_stiffness[c]),
               "damping": float(robot.cable_damping[c]),
               "actuated": bool(robot.cable_actuated[c])}
        if robot.cable_slack_damping[c] != DEFAULT_SLACK_DAMPING:
            cab["slack_damping"] = float(robot.cable_slack_damping[c])
        if robot.cable_actuated[c]:
            cab["command_range"] = robot.cable_command_range[c].tolist()
        cables.append(cab)
    a, con = robot.actuator, robot.contact
    return {
        "name": robot.name, "gravity": robot.gravity.tolist(), "engine": {"dt": float(robot.dt)}
        | ({"integrator": robot.integrator} if robot.integrator != "semi_implicit" else {}),
        "rods": rods, "cables": cables,
        "actuator": {"time_constant": a.time_constant, "gain": a.gain, "offset": a.offset}
        | ({} if a.max_speed == DEFAULT_MAX_SPEED else {"max_speed": a.max_speed})
        | ({"delay": a.delay} if a.delay else {})
        | ({"max_command_rate": a.max_command_rate} if math.isfinite(a.max_command_rate) else {}),
        "contact": {"ground_height": con.ground_height, "rod_rod": con.rod_rod,
                    "stiffness": con.stiffness, "damping": con.damping,
                    "friction": {"sliding": con.friction.sliding,
                                 "torsional": con.friction.torsional,
                                 "rolling": con.friction.rolling}}
        | ({} if con.law == "penalty" else {"law": con.law, "solref": list(con.solref), "solimp": list(con.solimp)})
        | ({"condim": con.condim} if con.condim else {}),
    }


def robot_to_yaml(robot: RobotConfig) -> str:
    return yaml.safe_dump(robot_to_dict(robot), sort_keys=False)


def topology_fingerprint(robot: RobotConfig) -> str:
    """Hash of what a model or a checkpoint depends on: rods (count, lengths) and cables
    (end points, which are actuated). Physical parameters do not enter it."""
    import hashlib
    import json

    desc = {"rods": int(robot.num_rods), "lengths": [round(float(x), 6) for x in robot.rod_length],
            "cables": np.asarray(robot.cable_ends).astype(int).tolist(),
            "actuated": np.asarray(robot.cable_actuated).astype(bool).tolist()}
    return hashlib.sha256(json.dumps(desc, sort_keys=True).encode()).hexdigest()[:16]
