"""The mujoco.sysid peer's model (bench/peer_sysid.py) replays the robot's own data exactly:
the comparison with the package is fair only if the peer, given the truth's structure and
values, predicts the truth to round-off (pushes, windows, activations, sensor timing)."""
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import peer_sysid  # noqa: E402

from tensegrity_engine.identification import dataset as ds  # noqa: E402


@pytest.fixture(scope="module")
def hanging(tmp_path_factory, three_bar):
    root = tmp_path_factory.mktemp("peer")
    ds.generate_dataset(three_bar, "noncontact", root, counts={"val": 2}, duration=2.0, dense=False, seed=1)
    return ds.load_split(root / "noncontact", "val", robot=three_bar)


def test_the_peer_model_replays_the_twin_exactly(three_bar, hanging):
    assert hanging[0].wrench is not None and np.abs(hanging[0].wrench).max() > 1.0     # pushes are there
    peer = peer_sysid.PeerModel(three_bar, floor=False, fixed_rods=(0,), integrator="Euler")
    ahead = peer_sysid.horizon_errors(peer, {}, hanging, (0.1, 1.0))
    assert max(ahead.values()) < 1e-9
    assert peer_sysid.open_loop_error(peer, {}, hanging) < 1e-9
    # and it is sensitive: another stiffness (or dropping the pushes) is far off
    stiffer = peer_sysid.horizon_errors(peer, {"cable_stiffness": 1.3 * three_bar.cable_stiffness.mean()},
                                        hanging, (1.0,))
    assert stiffer[1.0] > 1e-3
    wins = peer.windows(hanging, 1.0, 1.0)
    for w in wins:
        w.control[:, three_bar.num_cables:] = 0.0
    pred = peer.predict_com(peer.compile({}), wins)
    assert max(np.abs(p - w.com).max() for p, w in zip(pred, wins)) > 1e-4


def test_sysid_module_says_how_to_get_it():
    module, why = peer_sysid.sysid_module()
    assert (module is None) == bool(why)
    if module is None:
        assert peer_sysid.REQUIREMENTS in why
