"""sensor_msgs/JointState as the cables' sensors: names map to the robot YAML's cables, a
message that cannot be mapped is refused with its reason, a good one reaches the aligner."""
import math

import numpy as np
import pytest

pytest.importorskip("sensor_msgs.msg", reason="ROS 2 message packages not importable")

from tensegrity_engine.identification.measurements import REST_LENGTH, TENSION  # noqa: E402
from tensegrity_engine.identification.streaming import StreamAligner, StreamConfig  # noqa: E402
from tensegrity_ros import conversions as conv  # noqa: E402
from tensegrity_ros.identifier_node import feed_aligner  # noqa: E402


def _state(names, position=(), effort=(), t=0):
    from sensor_msgs.msg import JointState

    m = JointState()
    conv.ns_to_stamp(t, m.header.stamp)
    m.name, m.position, m.effort = list(names), [float(v) for v in position], [float(v) for v in effort]
    return m


def test_named_cables_land_in_config_order_and_the_rest_stay_unmeasured(three_bar):
    names = list(three_bar.cable_names)
    C = len(names)
    rest, tension, problem = conv.joint_state_to_cable_states(
        _state([names[2], names[0]], effort=[20.0, 10.0]), names)
    assert problem == "" and rest is None
    assert tension[0] == 10.0 and tension[2] == 20.0 and np.isnan(np.delete(tension, [0, 2])).all()
    assert tension.shape == (C,)
    # the bridge's message of every cable reads back as it was written, NaN kept
    r, f = np.linspace(0.5, 1.0, C), np.linspace(1.0, 50.0, C)
    r[1] = math.nan
    back = conv.joint_state_to_cable_states(conv.cable_states_message(r, f, 5, names), names)
    np.testing.assert_array_equal(back[0], r)
    np.testing.assert_array_equal(back[1], f)


@pytest.mark.parametrize("names, position, effort, words", [
    (["warp_drive"], [], [1.0], "cable names"),
    (["A", "A"], [], [1.0, 2.0], "distinct"),
    ([], [], [], "cable names"),
    (["A", "B"], [], [1.0], "1 values for 2"),
    (["A", "B"], [0.5], [], "1 values for 2"),
    (["A"], [], [], "neither"),
])
def test_a_message_that_cannot_be_mapped_is_refused_with_its_reason(three_bar, names, position, effort, words):
    cables = list(three_bar.cable_names)
    names = [cables[0] if n == "A" else cables[1] if n == "B" else n for n in names]
    rest, tension, problem = conv.joint_state_to_cable_states(_state(names, position, effort), cables)
    assert rest is None and tension is None and words in problem


def test_the_identifier_feeds_cable_states_to_its_aligner_and_counts_a_refusal(three_bar):
    aligner = StreamAligner(StreamConfig.for_robot(three_bar, interval=0.1))
    names = list(three_bar.cable_names)
    C = len(names)
    ok = feed_aligner(aligner, "cables", _state(names, np.full(C, 0.8), np.full(C, 30.0), t=10), "world", [])
    assert ok == (True, "ok", "")
    refused = feed_aligner(aligner, "cables", _state(["nope"], [], [1.0], t=20), "world", [])
    assert refused[:2] == (False, "wrong_length") and "cable names" in refused[2]
    out_of_range = feed_aligner(aligner, "cables", _state(names, [], np.full(C, 1e9), t=30), "world", [])
    assert out_of_range[:2] == (False, "out_of_range")
    assert aligner.stats()["cable_states_accepted"] == 1
    assert aligner._cables.by_stamp[10][:, REST_LENGTH].tolist() == [0.8] * C
    assert aligner._cables.by_stamp[10][:, TENSION].tolist() == [30.0] * C


def test_the_controller_keeps_the_newest_encoder_reading_and_refuses_bad_ones(three_bar):
    """The controller's side (`on_cable_states`): the winches' rest lengths are kept for the
    next tick; load cells alone are accepted and not kept; unmappable, out-of-range and
    out-of-order messages are refused and counted as the identifier refuses them."""
    import threading
    from types import SimpleNamespace

    from tensegrity_engine.identification.measurements import StampOrder
    from tensegrity_ros.mppi_controller import on_cable_states

    counts = {}
    bump = lambda k: counts.__setitem__(k, counts.get(k, 0) + 1)       # noqa: E731
    diag = SimpleNamespace(received=lambda topic: bump(f"{topic}_received"),
                           accept=lambda topic: bump(f"{topic}_accepted"),
                           reject=lambda reason, detail="", topic="": bump(f"{topic}_{reason}"))
    node = SimpleNamespace(diag=diag, robot=three_bar, checks=StreamConfig.for_robot(three_bar),
                           order=StampOrder(int(5e9)), _lock=threading.Lock(), _encoders=None)
    names = list(three_bar.cable_names)
    rest = np.where(three_bar.cable_actuated, 0.9 * three_bar.cable_rest_length, np.nan)
    on_cable_states(node, conv.cable_states_message(rest, None, 200, names))
    assert node._encoders[0] == 200 and np.array_equal(node._encoders[1], rest, equal_nan=True)
    on_cable_states(node, conv.cable_states_message(None, np.full(len(names), 30.0), 300, names))
    assert node._encoders[0] == 200                                   # load cells: nothing for the planner
    for bad, reason in ((_state(["nope"], position=[1.0], t=400), "wrong_length"),
                        (conv.cable_states_message(-rest, None, 500, names), "out_of_range"),
                        (conv.cable_states_message(rest, None, 250, names), "out_of_order")):
        on_cable_states(node, bad)
        assert counts.get(f"cables_{reason}") == 1, (reason, counts)
    assert node._encoders[0] == 200
    assert counts["cables_received"] == 5 and counts["cables_accepted"] == 2
