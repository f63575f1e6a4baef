"""The gate's reference models are rolled out once per held-out block: the blocks it scored
before keep their scores while new ones arrive, and a block whose inputs changed is scored
again."""
import dataclasses

import numpy as np
import pytest
import torch

from rolling_records import rolling_twin_run
from tensegrity_engine.identification.acceptance import chain_keys, heldout_scores
from tensegrity_engine.identification.solvers.windows import gapped_windows

WIDTH = 10
DROPPED = (14,)      # one chain runs across a lost frame


@pytest.fixture(scope="module")
def records(superball):
    longer, _ = rolling_twin_run(superball, seconds=4.2, dropped=DROPPED)
    shorter, _ = rolling_twin_run(superball, seconds=3.2, dropped=DROPPED)     # the same record, cut
    return longer, shorter


def _spy_windows(run, monkeypatch) -> list:
    """The number of windows of every rollout ``run``'s objective makes."""
    rolled = []
    rollout = run.objective.window_rollout

    def counted(data, windows, *a, **kw):
        rolled.append(int(windows.shape[0]))
        return rollout(data, windows, *a, **kw)
    monkeypatch.setattr(run.objective, "window_rollout", counted)
    return rolled


def test_a_reference_model_is_rolled_out_only_on_the_blocks_it_has_not_scored(records, monkeypatch):
    longer, shorter = records
    truth = {k: v.detach().tolist() for k, v in longer.engine.param_values(longer.dtype, longer.device).items()}
    truth["cable_stiffness"] = [0.8 * v for v in truth["cable_stiffness"]]      # a model that misses
    rolled = _spy_windows(longer, monkeypatch)
    everything = heldout_scores(longer, longer.train.ts, truth, chain=WIDTH, per_block=True)
    fresh_windows = sum(rolled)
    assert len(everything[0]) == 4 and np.all(everything[1] > 1e-4)     # 4 blocks, each off

    known = {}
    rolled.clear()
    first = heldout_scores(longer, shorter.train.ts, truth, chain=WIDTH, per_block=True, known=known)
    assert len(first[0]) == len(known) == 3
    rolled.clear()
    grown = heldout_scores(longer, longer.train.ts, truth, chain=WIDTH, per_block=True, known=known)
    # only the new block was rolled out, and every block scores as if all were rolled out
    # together (to the rounding a batch of another size leaves after the start velocities' fit)
    assert 4 * sum(rolled) == fresh_windows
    for cached, full in zip(grown, everything):
        assert np.allclose(cached, full, rtol=1e-4, atol=0)
    assert len(known) == 4
    rolled.clear()
    again = heldout_scores(longer, longer.train.ts, truth, chain=WIDTH, per_block=True, known=known)
    assert sum(rolled) == 0 and all(np.array_equal(a, b) for a, b in zip(again, grown))


def test_a_block_whose_actuator_state_or_model_changed_is_scored_again(records):
    longer, _ = records
    data = longer.train
    p = {k: v.detach() for k, v in longer.engine.param_values(longer.dtype, longer.device).items()}
    chains = torch.as_tensor(gapped_windows(data, WIDTH, fit=3))
    keys = chain_keys(longer, data, chains, p)
    assert len(set(keys)) == len(keys) == 4
    assert chain_keys(longer, data, chains, p) == keys                   # a pure function of its inputs
    # the window before the held-out blocks moved on and leaves the motors elsewhere
    moved = dataclasses.replace(data.ts, traj_act0=[a + 0.01 for a in data.ts.traj_act0])
    moved_data = longer._to_data(moved)
    assert not set(chain_keys(longer, moved_data, chains, p)) & set(keys)
    # a slower motor: every block's actuator state along the record differs
    slower = {**p, "actuator_time_constant": 2.0 * p["actuator_time_constant"]}
    assert not set(chain_keys(longer, data, chains, slower)) & set(keys)
