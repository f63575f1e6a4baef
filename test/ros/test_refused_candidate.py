"""A candidate the hold-out gate refuses is never published, but the operator sees it: the
identifier's diagnostics carry its values and the sim2sim summary reports them against the
truth (the twin's published model is the config, so without this the summary shows
nothing of what was identified)."""
import threading
from types import SimpleNamespace

import numpy as np
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


def test_a_limit_the_robot_lacks_is_shown_but_never_waited_for(capsys):
    from tensegrity_ros.sim2sim import parameter_rows
    truth = {"cable_stiffness": [7000.0], "actuator_max_speed": [1e3]}          # a twin: no winch limit
    config = {"cable_stiffness": [10000.0], "actuator_max_speed": [1e3]}
    msgs = [(10.0, "fine", {"cable_stiffness": [9000.0], "actuator_max_speed": [1.7]}, 0.1, {}, (1.0, 2.0)),
            (20.0, "fine", {"cable_stiffness": [7100.0], "actuator_max_speed": [1.6]}, 0.1,
             {"cable_stiffness": [50.0], "actuator_max_speed": [0.5]}, (1.0, 2.0))]
    rows, within = parameter_rows(msgs, truth, config, ["cable_stiffness", "actuator_max_speed"])
    by = {r["name"]: r for r in rows}
    assert by["actuator_max_speed"]["limit"] and by["actuator_max_speed"]["unlimited"]
    assert by["actuator_max_speed"]["rel_error"] is None          # no error against "no limit"
    assert not by["cable_stiffness"]["limit"]
    assert within == 20.0                    # stiffness within 5 % from the second message; the limit ignored
    # a robot that has the limit: scored like any value, still not waited for
    rows, within = parameter_rows(msgs, {**truth, "actuator_max_speed": [0.25]}, config, None)
    assert not {r["name"]: r for r in rows}["actuator_max_speed"]["unlimited"] and within == 20.0
    # 9000 is 28.6 % off, 7100 1.4 %: within 10 % from the second message too; within 30 % from the first
    assert parameter_rows(msgs, truth, config, None, tolerance=0.10)[1] == 20.0
    assert parameter_rows(msgs, truth, config, None, tolerance=0.30)[1] == 10.0
    print_summary({"wall_seconds": 1.0, "sim_seconds": 1.0, "poses": 10, "parameters_published": 2,
                   "final_stage": "fine", "parameters": parameter_rows(msgs, truth, config, None)[0],
                   "within_5_percent_from_sim_t": None, "within_10_percent_from_sim_t": 20.0})
    out = capsys.readouterr().out
    assert "the robot has no such limit" in out
    assert "(limits aside) never, within 10 % (the target from a mocap with noise) from sim t=20.0 s" in out


def test_a_per_cable_value_is_scored_as_its_mean_with_a_sigma_correlated_errors_cannot_beat(capsys):
    from tensegrity_ros.sim2sim import parameter_rows
    truth = {"cable_stiffness": [9000.0, 10000.0, 11000.0, 10000.0]}
    config = {"cable_stiffness": [10000.0]}
    got = [10100.0, 11200.0, 12300.0, 9900.0]             # three 12 % high together, one 1 % low
    sigma = [400.0, 400.0, 500.0, 300.0]
    msgs = [(10.0, "fine", {"cable_stiffness": got}, 0.1, {"cable_stiffness": sigma}, (1.0, 2.0))]
    (row,), _ = parameter_rows(msgs, truth, config, None)
    assert row["identified"] == pytest.approx(10875.0) and row["true"] == pytest.approx(10000.0)
    assert row["sigma"] == pytest.approx(400.0)           # not sqrt(sum sigma^2) / 4 = 203
    assert row["elements_covered"] == (1, 4)
    print_summary({"wall_seconds": 1.0, "sim_seconds": 1.0, "poses": 10, "parameters_published": 1,
                   "final_stage": "fine", "parameters": [row]})
    assert "1 of 4 elements within 2 sigma of their own true value" in capsys.readouterr().out
    msgs[0][4]["cable_stiffness"] = [np.inf] * 4                    # pinned: no element has a sigma
    (row,), _ = parameter_rows(msgs, truth, config, None)
    print_summary({"wall_seconds": 1.0, "sim_seconds": 1.0, "poses": 10, "parameters_published": 1,
                   "final_stage": "fine", "parameters": [row]})
    assert row["elements_covered"] == (0, 0) and "no element has a finite sigma" in capsys.readouterr().out
    # a shared value against a per-cable truth: its mean scored, no per-element count
    msgs = [(10.0, "fine", {"cable_stiffness": [10500.0]}, 0.1, {"cable_stiffness": [300.0]}, (1.0, 2.0))]
    (row,), _ = parameter_rows(msgs, truth, config, None)
    assert row["sigma"] == 300.0 and row["elements_covered"] is None


def test_a_default_learn_list_scores_every_published_value_and_none_claims_nothing():
    from tensegrity_ros.params import load_robot
    from tensegrity_ros.sim2sim import parameter_rows, summary_learn
    robot = load_robot("superball")
    assert summary_learn(["default"], robot) is None and summary_learn(None, robot) is None
    assert summary_learn(["cable_stiffness", "contact"], robot)[0] == "cable_stiffness"
    assert len(summary_learn(["contact"], robot)) > 1                  # a group, resolved for the law
    msgs = [(5.0, "fine", {"cable_stiffness": [7000.0]}, 0.1, {}, (1.0, 2.0))]
    rows, within = parameter_rows(msgs, {"cable_stiffness": [7000.0]}, {"cable_stiffness": [1e4]}, None)
    assert [r["name"] for r in rows] == ["cable_stiffness"] and within == 5.0
    # nothing scored (only a limit, or no true values): no "within 5 %" time
    assert parameter_rows(msgs, {}, {}, None) == ([], None)


def test_the_summary_puts_the_configs_heldout_error_beside_the_identified_models(capsys):
    """The identifier's diagnostic (m, a string; 'nan' before any publication) reaches the
    summary as the config's CoM error beside the published and the replaced model's."""
    from tensegrity_ros.sim2sim import published_config_com_error

    mon = SimpleNamespace(lock=threading.Lock(), diag={"identifier": {"published_config_com_error": "nan"}})
    assert published_config_com_error(mon) is None
    mon.diag["identifier"]["published_config_com_error"] = "0.0653"
    assert published_config_com_error(mon) == pytest.approx(0.0653)
    row = {"name": "cable_stiffness", "true": 5000.0, "identified": 4950.0, "sigma": 95.0, "first_published": 4950.0,
           "rel_error": 0.01, "config": 10000.0, "config_rel_error": 1.0}
    summary = {"wall_seconds": 1.0, "sim_seconds": 1.0, "poses": 10, "parameters_published": 1,
               "final_stage": "converged", "parameters": [row], "heldout_com_error_1s": 0.0266,
               "replaced_com_error_1s": 0.0301, "robot_truth": "zoo/soft_slow", "robot_description": "soft, slow"}
    print_summary({**summary, "config_com_error_1s": published_config_com_error(mon)})
    out = capsys.readouterr().out
    assert "26.6 mm (the model it replaced: 30.1 mm; the config: 65.3 mm)" in out and "zoo/soft_slow" in out
    print_summary(summary)
    assert "(the model it replaced: 30.1 mm)" in capsys.readouterr().out


def test_a_refused_first_fit_publishes_the_config_without_calling_it_identified(monkeypatch):
    """The gate refuses the finished fit and nothing was published before: the config's
    values go out with the end state, and the session still holds no identified model (the
    MJCF export then says so instead of writing the config as identified). No sigma is
    estimated, of the fit or of the config's values (seconds of the worker's time, measured
    in the sim2sim before the gate's first blocks); once a model is published, a refused
    end is said with the published model's sigma."""
    from tensegrity_engine.physics.config import load_robot
    from tensegrity_engine.physics.params import PhysicalParameters
    from tensegrity_ros import identifier_node as node_module

    robot = load_robot("three_bar")
    verdict = SimpleNamespace(accepted=False, reason="worse", revert=False, tuples=30, candidate_loss=2.0,
                              incumbent_loss=1.0, candidate_com_error=0.2, incumbent_com_error=0.1,
                              config_com_error=0.1)
    fitted = {"cable_stiffness": [5000.0]}
    session = SimpleNamespace(best_values=None, published_robot=None, incumbent_robot=robot, status="converged",
                              finish=lambda: ({"epoch": 3}, fitted), gate=lambda values: verdict,
                              trainer=SimpleNamespace(learn=("cable_stiffness",), format_parameters=lambda: ""))
    session.mark_published = lambda values, robot=None: setattr(session, "best_values", values)
    published, estimated, stages = [], [], []

    def publish(m, values, **kw):                     # as IdentifierNode._publish marks it published
        published.append(values)
        estimated.append(kw.get("estimate", True))
        session.mark_published(values, kw.get("robot"))
    node = SimpleNamespace(session=session, diag=_Diag(), last_gate=None, last_refused=None, epochs=3,
                           trainer=session.trainer, _publish=publish, _save_checkpoint=lambda: None,
                           get_logger=lambda: SimpleNamespace(info=lambda *a: None))
    monkeypatch.setattr(node_module, "end_stage", lambda node, status, values: stages.append(values) or status)
    monkeypatch.setattr(node_module, "refused_finish_stage", lambda node, gate, stage, fitted: stage)
    node_module.IdentifierNode._on_done(node)
    assert published == [PhysicalParameters(robot).as_dict()] and estimated == [False] and stages == []
    assert session.best_values is None
    session.best_values = {"cable_stiffness": [6000.0]}             # a model published since
    node_module.IdentifierNode._on_done(node)
    assert published[-1] == {"cable_stiffness": [6000.0]} and estimated[-1] is True and stages == [fitted]


def test_an_end_that_fails_to_publish_is_published_on_the_next_pass():
    """The schedule's end raised while it was published (the gate, sigma, the message): the
    session is left finished, so the worker's next pass publishes it."""
    from tensegrity_ros import identifier_node as node_module

    session = SimpleNamespace(converged=False)

    def failing_end():
        session.converged = True                   # as OnlineIdentification.finish
        raise RuntimeError("the message could not be built")
    node = SimpleNamespace(session=session, pacing=SimpleNamespace(drop=lambda: None), _on_done=failing_end)
    with pytest.raises(RuntimeError):
        node_module.IdentifierNode._finish_schedule(node)
    assert session.converged is False


def test_closing_while_the_worker_is_mid_epoch_writes_no_half_updated_checkpoint():
    """The worker stops only between epochs; if it has not stopped when the node closes, the
    session it is changing is not written (the last checkpoint stands); once it stopped, it is."""
    from tensegrity_ros import identifier_node as node_module

    for alive in (True, False):
        saved = []
        worker = SimpleNamespace(join=lambda timeout: None, is_alive=lambda: alive)
        node = SimpleNamespace(_stop=threading.Event(), _worker=worker, _save_checkpoint=lambda: saved.append(1),
                               get_logger=lambda: SimpleNamespace(warning=lambda *a: None))
        node_module.IdentifierNode.close(node)
        assert node._stop.is_set() and saved == ([] if alive else [1])
