"""The fuzz harness, short version (CI): hostile messages on every subscribed topic against
the three nodes over real DDS; every message accounted for, no hostile one accepted,
nothing dies, and a clean stream afterwards still becomes tuples and training."""
import os
import time

import pytest

try:
    import rclpy  # noqa: F401
    from rclpy.parameter import Parameter
    from tensegrity_ros_interfaces.msg import CableCommand  # noqa: F401
except ImportError as exc:  # pragma: no cover
    pytest.skip(f"ROS 2 not importable ({exc})", allow_module_level=True)

from tensegrity_ros.fuzz import FuzzHarness, node_parameters, remap_args  # noqa: E402
from tensegrity_ros.fuzz_messages import HostileStream  # noqa: E402

from ros_harness import wait_for  # noqa: E402

MESSAGES = int(os.environ.get("TENSEGRITY_FUZZ_MESSAGES", "10000"))


def _node(ros, cls, name, params):
    node = cls(context=ros.context, cli_args=remap_args(name),
               parameter_overrides=[Parameter(k, value=v) for k, v in params.items()])
    return ros.add(node)


def test_fuzzed_nodes_account_for_every_message(ros):
    from tensegrity_engine.groundtruth.environments import rest_pose
    from tensegrity_ros.identifier_node import IdentifierNode
    from tensegrity_ros.mppi_controller import MppiControllerNode
    from tensegrity_ros.mujoco_bridge import MujocoBridge
    from tensegrity_ros.params import load_robot

    robot = load_robot("three_bar")
    params = node_parameters("three_bar")
    ident = _node(ros, IdentifierNode, "identifier", params["identifier"])
    ctrl = _node(ros, MppiControllerNode, "mppi_controller", params["mppi_controller"])
    bridge = _node(ros, MujocoBridge, "mujoco_bridge", params["mujoco_bridge"])
    harness = FuzzHarness(ros.plain("fuzzer"), robot)
    assert harness.wait_ready(60), harness.diag.keys()

    stream = HostileStream(robot, rest_pose(robot)[0], seed=1234)
    t0 = time.monotonic()
    harness.send(stream.items(MESSAGES))
    assert not harness.lost, harness.lost                        # every chunk accounted for in time
    assert sum(harness.sent.values()) >= MESSAGES
    fuzz_s = time.monotonic() - t0
    # every kind of hostile message was sent
    kinds = {k for (_, k) in harness.kinds}
    assert {"nan", "size_1000", "negative_stamp", "duplicate", "out_of_order", "jump_back", "jump_forward",
            "wrong_frame", "huge_rate", "unknown_name", "widened_bounds", "too_fast", "valid"} <= kinds
    tuples_before = harness.value("identifier", "stream_tuples_made")
    epochs_before = harness.value("identifier", "epochs")

    # recovery: a clean stream after the storm still becomes tuples and training goes on
    harness.send(stream.clean(40))
    assert wait_for(lambda: harness.value("identifier", "stream_tuples_made") >= tuples_before + 30, 30)
    assert wait_for(lambda: harness.value("identifier", "epochs") > epochs_before, 120)
    assert harness.wait_caught_up(30)
    report = harness.accounting()
    problems = harness.failures(report)
    assert not problems, (problems, report)
    assert wait_for(lambda: harness.identifier_parameters >= 1, 60)   # the identifier published
    assert report["mppi_controller"]["topics"]["parameters"]["accepted"] >= 1
    assert harness.value("mppi_controller", "models_swapped") <= harness.valid["parameters"]
    assert harness.commands_seen > 0                              # the controller kept commanding
    assert ident._worker.is_alive() and ctrl._worker.is_alive() and bridge._thread.is_alive()
    for n in ros.nodes:
        assert n.context.ok()
    print(f"\nfuzz: {sum(harness.sent.values())} messages in {fuzz_s:.0f} s; "
          f"{sum(r['rejected'] for a in report.values() for r in a['topics'].values()):.0f} rejections")
