"""Declared ROS parameters with descriptions and ranges, and config-file lookup."""
from __future__ import annotations

import difflib
import os
import re
from pathlib import Path
from typing import Any, Optional, Sequence

from rcl_interfaces.msg import FloatingPointRange, IntegerRange, ParameterDescriptor
from rclpy.exceptions import ParameterException

from .common import ConfigurationError


def declare(node, name: str, default: Any, description: str, *,
            range: Optional[Sequence[float]] = None, read_only: bool = False,
            choices: Optional[Sequence[str]] = None):
    """Declare ``name`` with a descriptor (description, numeric range, read-only) and
    return its value. ``range`` = (from, to) or (from, to, step)."""
    desc = ParameterDescriptor(description=description, read_only=read_only)
    if choices:
        desc.additional_constraints = "one of: " + ", ".join(choices)
    if range is not None:
        lo, hi = range[0], range[1]
        step = range[2] if len(range) > 2 else 0
        if isinstance(default, bool):
            pass
        elif isinstance(default, int):
            desc.integer_range = [IntegerRange(from_value=int(lo), to_value=int(hi), step=int(step))]
        elif isinstance(default, float):
            desc.floating_point_range = [FloatingPointRange(from_value=float(lo), to_value=float(hi),
                                                            step=float(step))]
    if isinstance(default, float):
        # accept `-p name:=20` (an INTEGER) for a float parameter
        desc.dynamic_typing = True
    try:
        value = node.declare_parameter(name, default, desc).value
    except ParameterException as exc:       # rclpy's range / type / read-only checks
        raise ConfigurationError(_parameter_problem(name, exc, range)) from None
    return check_parameter(name, value, default, range=range, choices=choices)


def check_parameter(name: str, value: Any, default: Any, *, range: Optional[Sequence[float]] = None,
                    choices: Optional[Sequence[str]] = None):
    """``value`` of parameter ``name`` checked as its declaration would (type of the
    default, range, choices); an int is accepted for a float. `ConfigurationError` if not."""
    numeric = isinstance(default, (int, float)) and not isinstance(default, bool)
    if isinstance(default, bool) and not isinstance(value, bool):
        raise ConfigurationError(f"parameter {name}: expected true/false, got {value!r}")
    if numeric and (isinstance(value, bool) or not isinstance(value, (int, float))):
        raise ConfigurationError(f"parameter {name}: expected a number, got {value!r}")
    if isinstance(default, int) and numeric and not isinstance(value, int):
        raise ConfigurationError(f"parameter {name}: expected an integer, got {value!r}")
    if isinstance(default, float):
        value = float(value)
    if numeric and range is not None and not (range[0] <= value <= range[1]):
        raise ConfigurationError(f"parameter {name}={value} is outside [{range[0]}, {range[1]}]")
    if isinstance(default, str) and not isinstance(value, str):
        raise ConfigurationError(f"parameter {name}: expected a string, got {value!r}")
    if isinstance(default, list) and not isinstance(value, list):
        raise ConfigurationError(f"parameter {name}: expected a list, got {value!r}")
    if choices and value not in choices:
        raise ConfigurationError(f"parameter {name}={value!r}: must be one of {list(choices)}")
    return value


def file_declarer(values: dict, where: str = "parameter file"):
    """A ``declare``-shaped callable over a node's ``ros__parameters`` dict (no node): the
    same defaults and checks, for tools that run a node's logic offline. Keys the
    declarations never ask for are an error (a typo would otherwise be ignored)."""
    asked: set = set()

    def d(name, default, description="", *, range=None, read_only=False, choices=None):
        asked.add(name)
        return check_parameter(name, values.get(name, default), default, range=range, choices=choices)

    def unused() -> list:
        return sorted(set(values) - asked - {"use_sim_time"})

    d.unused = unused
    d.where = where
    return d


def undeclared_overrides(node) -> list:
    """Names given to ``node`` (its parameter file's section, ``-p name:=value``) that it
    never declared. rclpy keeps such overrides and ignores them without a word, so a typo
    (``max_secnds``) would run with the default."""
    overrides = getattr(node, "_parameter_overrides", None)
    if overrides is None:       # an rclpy without the attribute: say so rather than pass unchecked
        raise ConfigurationError("this rclpy does not expose a node's parameter overrides; "
                                 "undeclared parameters cannot be checked")
    return sorted(set(overrides) - set(node._parameters))


def refuse_undeclared(node) -> None:
    """`ConfigurationError` naming every undeclared parameter given to ``node``, each with
    the nearest declared names."""
    unknown = undeclared_overrides(node)
    if not unknown:
        return
    declared = sorted(node._parameters)
    hints = []
    for name in unknown:
        near = difflib.get_close_matches(name, declared, n=2, cutoff=0.6)
        hints.append(name + (f" (did you mean {' or '.join(near)}?)" if near else ""))
    raise ConfigurationError(f"node {node.get_name()} declares no parameter {', '.join(hints)} "
                             "(given in its parameter file or by -p; it would run with its default)")


def _parameter_problem(name: str, exc: Exception, range) -> str:
    """One line for rclpy's refusal of ``name``: 'parameter lr0=100.0 is outside [1e-06, 10.0]'."""
    text = " ".join(str(exc).split())
    value = re.match(r"Invalid parameter value \((.*)\) for parameter", text)
    if value and range is not None and "out of range" in text:
        return f"parameter {name}={value.group(1)} is outside [{range[0]}, {range[1]}]"
    return f"parameter {name}: {text.split('Reason:', 1)[-1].strip()}"


def share_dir() -> Optional[Path]:
    """The installed share/tensegrity_ros (ament index), if any."""
    try:
        from ament_index_python.packages import get_package_share_directory

        return Path(get_package_share_directory("tensegrity_ros"))
    except Exception:  # noqa: BLE001 - not installed as a ROS package
        return None


def config_dirs() -> list[Path]:
    """Where config YAMLs are looked up: the source tree first, then the share dir."""
    dirs = []
    try:
        from tensegrity_engine.physics.config import CONFIG_DIR

        dirs.append(Path(CONFIG_DIR))
    except Exception:  # noqa: BLE001
        pass
    sd = share_dir()
    if sd is not None:
        dirs.append(sd / "config")
    return dirs


def resolve_config(name_or_path: str, suffix: str = ".yaml") -> Path:
    """A path, or a bare name ('superball', 'sim2sim') found in `config_dirs()`."""
    p = Path(os.path.expanduser(str(name_or_path)))
    if p.exists():
        return p
    for d in config_dirs():
        for cand in (d / str(name_or_path), d / f"{name_or_path}{suffix}"):
            if cand.exists():
                return cand
    raise ConfigurationError(f"config {name_or_path!r} not found (looked in {[str(d) for d in config_dirs()]})")


def load_robot(name_or_path: str):
    """The robot config; a missing or malformed file is a `ConfigurationError`."""
    from tensegrity_engine.physics.params import load_representable as _load

    path = resolve_config(name_or_path)
    try:
        return _load(path)
    except (OSError, ValueError, KeyError, TypeError) as exc:
        said = str(exc)           # the loader's messages start with the file already
        raise ConfigurationError(said if said.startswith(str(path)) else f"robot config {str(path)!r}: {said}") from None
