"""A candidate the hold-out gate refuses is never published, but the operator sees it: the
identifier's diagnostics carry its values and the sim2sim summary reports them against the
truth (the twin's published model is the config, so without this the summary shows
nothing of what was identified)."""
import threading
from types import SimpleNamespace

import pytest

from tensegrity_ros.identifier_node import passes_gate
from tensegrity_ros.sim2sim import print_summary, refused_candidate


class _Diag:
    def __init__(self):
        self.counts = {}

    def count(self, key):
        self.counts[key] = self.counts.get(key, 0) + 1

    def warn_throttled(self, key, message):
        pass


def _node(accepted: bool):
    verdict = SimpleNamespace(accepted=accepted, reason="worse", tuples=10, candidate_loss=2.0, incumbent_loss=1.0)
    session = SimpleNamespace(gate=lambda values: verdict,
                              trainer=SimpleNamespace(learn=("cable_stiffness", "actuator_time_constant")))
    return SimpleNamespace(session=session, diag=_Diag(), last_gate=None, last_refused=None)


def test_a_refused_candidate_is_kept_for_diagnostics_and_the_summary(capsys):
    values = {"cable_stiffness": [9800.0, 9900.0], "actuator_time_constant": [0.046], "rod_mass": [10.0]}
    node = _node(accepted=False)
    assert not passes_gate(node, values)
    assert node.last_refused == pytest.approx({"cable_stiffness": 9850.0, "actuator_time_constant": 0.046})
    assert node.diag.counts == {"gate_rejected_worse": 1}
    accepted = _node(accepted=True)
    assert passes_gate(accepted, values) and accepted.last_refused is None

    # the sim2sim monitor reads the identifier's diagnostics (key: value strings)
    mon = SimpleNamespace(lock=threading.Lock(), diag={"identifier": {
        "refused_cable_stiffness": "9850", "refused_actuator_time_constant": "0.046", "status": "converged"}})
    rel = refused_candidate(mon, {"cable_stiffness": [10000.0], "actuator_time_constant": [0.05]})
    assert rel == pytest.approx({"cable_stiffness": -0.015, "actuator_time_constant": -0.08})
    print_summary({"wall_seconds": 1.0, "sim_seconds": 1.0, "poses": 10, "parameters_published": 1,
                   "final_stage": "converged", "parameters": [], "refused_candidate": rel})
    out = capsys.readouterr().out
    assert "refused by the hold-out gate" in out and "cable_stiffness -1.5%" in out and "-8.0%" in out
