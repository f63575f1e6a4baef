"""Make the repo's engine/ importable as `tensegrity_engine` when it is not installed, and
the robot fixtures every test module shares."""
import sys
from pathlib import Path

import pytest

try:
    import tensegrity_engine  # noqa: F401
except ImportError:
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "engine"))


@pytest.fixture(scope="module")
def superball():
    from tensegrity_engine.physics.config import load_robot
    return load_robot("superball")


@pytest.fixture(scope="module")
def three_bar():
    from tensegrity_engine.physics.config import load_robot
    return load_robot("three_bar")
