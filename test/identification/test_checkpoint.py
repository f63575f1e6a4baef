"""Checkpoints are read without pickle: a crafted file is refused and runs nothing."""
import math
import re
from pathlib import Path

import numpy as np
import pytest
import torch
from hostile_payloads import HostilePickle, hostile_bytes

from tensegrity_engine.identification import checkpoint
from tensegrity_engine.identification.checkpoint import CheckpointError, load_checkpoint, save_checkpoint

ROOT = Path(__file__).resolve().parents[2]


def test_round_trip_keeps_structure_types_and_special_values(three_bar, tmp_path):
    payload = {"params": {"cable_stiffness": torch.tensor([1.5, 2.5], dtype=torch.float64)},
               "optimizer": {"state": {0: {"step": torch.tensor(3.0)}}, "groups": [{"betas": (0.9, 0.999)}]},
               "rng": {"state": 2 ** 127 + 12345}, "history": [{"loss": math.nan, "val": math.inf, "ok": True}],
               "windows": torch.zeros(0, 3, dtype=torch.long), "mask": torch.tensor([True, False]),
               "array": np.arange(4, dtype=np.int32), "__latent": None, "name": "x", "nothing": None}
    path = save_checkpoint(tmp_path / "c.safetensors", payload, robot=three_bar, kind="trainer")
    got = load_checkpoint(path, robot=three_bar, kind="trainer")
    assert torch.equal(got["params"]["cable_stiffness"], payload["params"]["cable_stiffness"])
    assert list(got["optimizer"]["state"]) == [0] and got["optimizer"]["state"][0]["step"].item() == 3.0
    assert got["optimizer"]["groups"][0]["betas"] == [0.9, 0.999]
    assert got["rng"]["state"] == 2 ** 127 + 12345
    assert math.isnan(got["history"][0]["loss"]) and got["history"][0]["val"] == math.inf
    assert got["windows"].shape == (0, 3) and got["mask"].dtype == torch.bool
    assert got["array"].dtype == np.int32 and "__latent" in got and got["nothing"] is None
    with pytest.raises(TypeError, match="cannot store"):
        save_checkpoint(tmp_path / "d.safetensors", {"x": object()}, robot=three_bar, kind="trainer")


@pytest.mark.parametrize("writer", ["pickle", "torch.save"])
def test_a_crafted_pickle_is_refused_and_runs_nothing(three_bar, tmp_path, writer):
    marker = tmp_path / "pwned"
    path = tmp_path / "identifier_checkpoint.safetensors"
    if writer == "pickle":
        path.write_bytes(hostile_bytes(marker))
    else:
        torch.save({"trainer": HostilePickle(marker)}, path)
    assert not marker.exists()
    with pytest.raises(CheckpointError, match="not a tensegrity-checkpoint file"):
        load_checkpoint(path, robot=three_bar, kind="identifier")
    assert not marker.exists()


def test_other_robot_kind_or_version_is_refused(three_bar, superball, tmp_path, monkeypatch):
    path = save_checkpoint(tmp_path / "c.safetensors", {"a": 1}, robot=three_bar, kind="trainer")
    with pytest.raises(CheckpointError, match="topology differs"):
        load_checkpoint(path, robot=superball, kind="trainer")
    with pytest.raises(CheckpointError, match="not 'identifier'"):
        load_checkpoint(path, robot=three_bar, kind="identifier")
    saved = checkpoint.VERSION
    monkeypatch.setattr(checkpoint, "VERSION", saved + 1)
    with pytest.raises(CheckpointError, match=f"version '{saved}'"):
        load_checkpoint(path, robot=three_bar, kind="trainer")


def test_malformed_payload_and_failed_write_raise_their_errors(three_bar, tmp_path, monkeypatch):
    from safetensors import SafetensorError
    from safetensors.torch import save_file

    deep = tmp_path / "deep.safetensors"
    save_file({}, str(deep), metadata={"format": checkpoint.FORMAT, "version": str(checkpoint.VERSION),
                                       "kind": "trainer", "topology": checkpoint.topology_fingerprint(three_bar),
                                       "payload": "[" * 200_000 + "]" * 200_000})
    with pytest.raises(CheckpointError, match="malformed"):
        load_checkpoint(deep, robot=three_bar, kind="trainer")

    def full_disk(*args, **kwargs):
        raise SafetensorError("Error while serializing: I/O error: No space left on device")
    monkeypatch.setattr("safetensors.torch.save_file", full_disk)
    with pytest.raises(OSError, match="No space left"):
        save_checkpoint(tmp_path / "c.safetensors", {"a": 1}, robot=three_bar, kind="trainer")
    assert not list(tmp_path.glob("c.safetensors*"))


def test_no_pickle_on_any_input_path():
    """No source file reads with pickle: no torch.load, pickle.load(s), allow_pickle=True."""
    pattern = re.compile(r"torch\.load\(|pickle\.loads?\(|allow_pickle\s*=\s*True|weights_only\s*=\s*False")
    found = []
    for folder in ("engine", "tensegrity_ros", "tools", "bench", "launch"):
        for path in (ROOT / folder).rglob("*.py"):
            for i, line in enumerate(path.read_text().splitlines(), 1):
                if pattern.search(line):
                    found.append(f"{path.relative_to(ROOT)}:{i}: {line.strip()}")
    assert not found, "\n".join(found)
