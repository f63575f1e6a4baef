"""The identification thread gives way: on a shared 2-core CPU the controller's ticks and
the driver's callbacks come first (sim2sims missed 2 of ~100 ticks while the identifier
trained through the MPPI phase)."""
import os
import sys
import threading

import pytest

try:
    import rclpy  # noqa: F401
    from tensegrity_ros_interfaces.msg import CableCommand  # noqa: F401
except ImportError as exc:  # pragma: no cover
    pytest.skip(f"ROS 2 not importable ({exc})", allow_module_level=True)

from ros_harness import wait_for  # noqa: E402

from tensegrity_ros.common import lower_thread_priority  # noqa: E402

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="per-thread niceness is Linux's")


def _niceness(tid: int) -> int:
    return os.getpriority(os.PRIO_PROCESS, tid)


def _in_thread(niceness: int) -> tuple:
    out = {}

    def run():
        tid = threading.get_native_id()
        before = _niceness(tid)
        out["problem"] = lower_thread_priority(niceness)
        out["change"] = (before, _niceness(tid))

    t = threading.Thread(target=run)
    t.start()
    t.join()
    return out["problem"], out["change"]


def test_lowering_a_threads_priority_leaves_the_others_alone():
    main = _niceness(threading.get_native_id())
    problem, (before, after) = _in_thread(5)
    assert problem == "" and after == min(19, before + 5)
    assert _in_thread(0)[1][0] == _in_thread(0)[1][1]
    assert _in_thread(40)[1][1] == 19                           # capped, no error
    assert _niceness(threading.get_native_id()) == main


@pytest.mark.parametrize("niceness", [10, 0])
def test_the_identifier_trains_below_the_nodes_priority(ros, niceness):
    from tensegrity_ros.identifier_node import IdentifierNode

    main = _niceness(threading.get_native_id())
    node = ros.node(IdentifierNode, {"robot": "three_bar", "device": "cpu", "min_tuples": 10 ** 6,
                                     "worker_niceness": niceness, "torch_threads": 1})
    assert wait_for(lambda: node._worker.native_id is not None, 10)
    assert wait_for(lambda: _niceness(node._worker.native_id) == min(19, main + niceness), 10)
    assert _niceness(threading.get_native_id()) == main          # the node's callbacks keep theirs
