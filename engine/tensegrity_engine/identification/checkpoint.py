"""Checkpoints without pickle.

A checkpoint is one safetensors file: every tensor (and numpy array) stored by name, and
everything else -- numbers, strings, lists, dicts, with their non-string keys and
non-finite floats tagged -- as JSON in the file's metadata, beside the format, its
version, the kind of state (``trainer``, ``identifier``) and the robot's name and topology
fingerprint. Reading parses JSON and raw tensor bytes only: a file someone else wrote can
at worst be refused (`CheckpointError`), never run code. Writing is atomic.
"""
from __future__ import annotations

import json
import math
import os
from pathlib import Path

import numpy as np
import torch

from tensegrity_engine.physics.config import RobotConfig, topology_fingerprint

FORMAT = "tensegrity-checkpoint"
VERSION = 5     # 2: rod_inertia_factor among the parameters; narrowed bounds saved; 3: cable_slack_damping;
#               4: actuator_delay; 5: contact_time_constant, contact_damping_ratio (the soft contact law)


class CheckpointError(ValueError):
    """A checkpoint that cannot be used here: not one, another version, robot or kind."""


def _encode(obj, tensors: dict):
    if isinstance(obj, torch.Tensor):
        key = f"t{len(tensors)}"
        tensors[key] = obj.detach().cpu().clone().contiguous()
        return {"__tensor__": key}
    if isinstance(obj, np.ndarray):
        key = f"t{len(tensors)}"
        tensors[key] = torch.from_numpy(np.ascontiguousarray(obj).copy())
        return {"__ndarray__": key}
    if isinstance(obj, (bool, np.bool_)):
        return bool(obj)
    if isinstance(obj, (int, np.integer)):
        return int(obj)
    if isinstance(obj, (float, np.floating)):
        value = float(obj)
        return value if math.isfinite(value) else {"__float__": repr(value)}
    if obj is None or isinstance(obj, str):
        return obj
    if isinstance(obj, (list, tuple)):
        return [_encode(v, tensors) for v in obj]
    if isinstance(obj, dict):
        if all(isinstance(k, str) and not k.startswith("__") for k in obj):
            return {k: _encode(v, tensors) for k, v in obj.items()}
        return {"__items__": [[_encode(k, tensors), _encode(v, tensors)] for k, v in obj.items()]}
    raise TypeError(f"cannot store a {type(obj).__name__} in a checkpoint")


def _decode(obj, tensors: dict, device):
    if isinstance(obj, list):
        return [_decode(v, tensors, device) for v in obj]
    if not isinstance(obj, dict):
        return obj
    if "__tensor__" in obj:
        return tensors[obj["__tensor__"]].to(device)
    if "__ndarray__" in obj:
        return tensors[obj["__ndarray__"]].numpy()
    if "__float__" in obj:
        return float(obj["__float__"])
    if "__items__" in obj:
        return {_hashable(_decode(k, tensors, device)): _decode(v, tensors, device) for k, v in obj["__items__"]}
    return {k: _decode(v, tensors, device) for k, v in obj.items()}


def _hashable(key):
    return tuple(key) if isinstance(key, list) else key


def save_checkpoint(path, payload: dict, *, robot: RobotConfig, kind: str) -> Path:
    """Write ``payload`` (nested dicts / lists of tensors, arrays, numbers, strings)."""
    from safetensors import SafetensorError
    from safetensors.torch import save_file

    tensors: dict = {}
    skeleton = _encode(payload, tensors)
    metadata = {"format": FORMAT, "version": str(VERSION), "kind": kind, "robot": robot.name,
                "topology": topology_fingerprint(robot), "payload": json.dumps(skeleton, allow_nan=False)}
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    try:
        save_file(tensors, str(tmp), metadata=metadata)
    except SafetensorError as exc:     # a write failure (full disk, unwritable file) is an OSError
        tmp.unlink(missing_ok=True)
        raise OSError(f"cannot write {path}: {exc}") from None
    os.replace(tmp, path)
    return path


def load_checkpoint(path, *, robot: RobotConfig, kind: str, device="cpu") -> dict:
    """Read a checkpoint written by `save_checkpoint` for this robot and kind, or raise
    `CheckpointError` saying why not."""
    from safetensors import SafetensorError, safe_open

    path = Path(path)
    try:
        with safe_open(str(path), framework="pt") as f:
            metadata = f.metadata() or {}
            tensors = {k: f.get_tensor(k) for k in f.keys()}
    except (SafetensorError, OSError, ValueError) as exc:
        raise CheckpointError(f"{path}: not a {FORMAT} file ({exc})") from None
    if metadata.get("format") != FORMAT:
        raise CheckpointError(f"{path}: not a {FORMAT} file")
    if metadata.get("version") != str(VERSION):
        raise CheckpointError(f"{path}: checkpoint format version {metadata.get('version')!r}, "
                              f"this version reads {VERSION}")
    if metadata.get("kind") != kind:
        raise CheckpointError(f"{path}: a {metadata.get('kind')!r} checkpoint, not {kind!r}")
    if metadata.get("topology") != topology_fingerprint(robot):
        raise CheckpointError(f"{path}: written for robot {metadata.get('robot')!r} whose topology "
                              f"differs from {robot.name!r}")
    try:
        return _decode(json.loads(metadata["payload"]), tensors, device)
    except (KeyError, TypeError, ValueError, IndexError, RecursionError) as exc:
        raise CheckpointError(f"{path}: malformed checkpoint payload ({type(exc).__name__})") from None
