"""Physical parameters to and from YAML: the identification's export (a complete robot
config, loadable by `load_robot`) and what a controller or tool reads back."""
from __future__ import annotations

import dataclasses

from pathlib import Path

import numpy as np
import yaml

from tensegrity_engine.physics.config import RobotConfig, robot_from_dict, robot_to_yaml, topology_fingerprint
from tensegrity_engine.physics.params import ParameterError, PhysicalParameters, checked_parameters, nominal_values


def export_yaml(params: PhysicalParameters, path, comment: str = "") -> Path:
    """Write the identified parameters as a complete robot config (loadable by load_robot)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    head = "# Identified by tensegrity_engine.identification\n"
    if comment:
        head += "".join(f"# {line}\n" for line in comment.splitlines())
    path.write_text(head + robot_to_yaml(params.to_robot_config()))
    return path


def params_from_file(robot: RobotConfig, path) -> PhysicalParameters:
    """`PhysicalParameters` of ``robot`` from a YAML file: either a robot config (the
    identification's export; its physical values are taken, topology must match) or a
    mapping ``{name: value or [values]}`` (``PhysicalParameters.as_dict()``), optionally
    under a ``parameters:`` key. A robot config's ``engine.integrator`` (the model's
    structure) and its ground contact law (``contact.law``, solimp, condim) come with its
    values."""
    with open(path) as fh:
        data = yaml.safe_load(fh)
    if isinstance(data, dict) and "rods" in data and "cables" in data:
        other = robot_from_dict(data, source=str(path))
        if topology_fingerprint(other) != topology_fingerprint(robot):   # its cables' ends and order too
            raise ValueError(f"{path}: robot topology differs from {robot.name}")
        values = nominal_values(other)
        if other.integrator != robot.integrator:
            robot = robot.replace(integrator=other.integrator)
        con = other.contact                   # the ground contact law is the model's structure too
        if (con.law, con.solimp, con.condim) != (robot.contact.law, robot.contact.solimp, robot.contact.condim):
            robot = robot.replace(contact=dataclasses.replace(robot.contact, law=con.law, solimp=con.solimp,
                                                              condim=con.condim))
    else:
        values = data.get("parameters", data) if isinstance(data, dict) else None
        if not isinstance(values, dict):
            raise ValueError(f"{path}: expected a robot config or a mapping of parameters")
    # A file is checked like a topic; equal per-element values stay one shared value where the
    # robot's own are alike too (where they differ, one value would scale their profile)
    configured = nominal_values(robot)
    shared = {k: v[:1] if np.size(v) > 1 and np.ptp(np.asarray(v, dtype=np.float64)) == 0
              and np.ptp(np.atleast_1d(configured.get(k, 0.0))) == 0 else v for k, v in values.items()}
    try:
        return checked_parameters(robot, shared)
    except ParameterError as exc:
        raise ParameterError(exc.reason, f"{path}: {exc}") from None
