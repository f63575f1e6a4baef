"""Make the repo's engine/ importable as `tensegrity_engine` when it is not installed, and
the robot fixtures every test module shares."""
import importlib.util
import sys
from pathlib import Path

import pytest

try:
    import tensegrity_engine  # noqa: F401
except ImportError:
    _engine = Path(__file__).resolve().parent.parent / "engine"
    _spec = importlib.util.spec_from_file_location(
        "tensegrity_engine", _engine / "__init__.py", submodule_search_locations=[str(_engine)])
    _module = importlib.util.module_from_spec(_spec)
    sys.modules["tensegrity_engine"] = _module
    _spec.loader.exec_module(_module)


@pytest.fixture(scope="module")
def superball():
    from tensegrity_engine.config import load_robot
    return load_robot("superball")


@pytest.fixture(scope="module")
def three_bar():
    from tensegrity_engine.config import load_robot
    return load_robot("three_bar")
