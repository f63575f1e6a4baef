"""Console-script entry points of the nodes. The signal handlers go in before the node's
module (torch, rclpy, the engine) is imported, so Ctrl-C during start-up stops a node
cleanly instead of raising KeyboardInterrupt inside an import."""
from __future__ import annotations

import importlib
import sys

from .common import ShutdownRequest, run_node


def _node(module: str, cls: str) -> int:
    ShutdownRequest.install()
    return run_node(lambda: getattr(importlib.import_module(f"tensegrity_ros.{module}"), cls))


def mujoco_bridge() -> int:
    return _node("mujoco_bridge", "MujocoBridge")


def identifier() -> int:
    return _node("identifier_node", "IdentifierNode")


def mppi_controller() -> int:
    return _node("mppi_controller", "MppiControllerNode")


def camera_tracker() -> int:
    return _node("camera_tracker", "CameraTrackerNode")


def example_driver() -> int:
    return _node("example_driver", "ExampleDriver")


def recorder() -> int:
    ShutdownRequest.install()
    from .recorder import main

    return main(sys.argv[1:])
