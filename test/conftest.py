"""Make the repo's engine/ importable as `tensegrity_engine` when it is not installed."""
import importlib.util
import sys
from pathlib import Path

try:
    import tensegrity_engine  # noqa: F401
except ImportError:
    _engine = Path(__file__).resolve().parent.parent / "engine"
    _spec = importlib.util.spec_from_file_location(
        "tensegrity_engine", _engine / "__init__.py", submodule_search_locations=[str(_engine)])
    _module = importlib.util.module_from_spec(_spec)
    sys.modules["tensegrity_engine"] = _module
    _spec.loader.exec_module(_module)
