"""The layering of `tensegrity_engine` and the thin ROS layer, checked on the source.

Lower layers never import higher ones; identification, control and perception are siblings, export
(MJCF, reports) sits above both; nothing but the benches imports the CLIs; the engine never
imports ROS. Imports inside functions count too (a lazy import is still a dependency)."""
import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
ENGINE = ROOT / "engine" / "tensegrity_engine"
LAYER = {"physics": 0, "groundtruth": 1, "identification": 2, "control": 2, "perception": 2, "export": 3, "cli": 4}
ROS_MODULES = ("rclpy", "rosidl_runtime_py", "tensegrity_ros", "tensegrity_ros_interfaces",
               "std_msgs", "geometry_msgs", "sensor_msgs", "diagnostic_msgs", "builtin_interfaces")
MAX_CLASS_LINES = 330


def _imports(path: Path, text: str = None) -> list[tuple[int, str]]:
    """(line, absolute module name) of every import in a file, relative ones resolved."""
    tree = ast.parse(path.read_text() if text is None else text, filename=str(path))
    package = path.relative_to(ROOT / "engine").with_suffix("").parts if ENGINE in path.parents else ()
    package = package[:-1]          # a module's (or __init__'s) own package
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(package[:len(package) - node.level + 1] + ((base,) if base else ()))
            found += [(node.lineno, f"{base}.{alias.name}" if base else alias.name) for alias in node.names]
    return found


def _layer_violations(path: Path, text: str = None) -> list[str]:
    own = path.relative_to(ENGINE).parts[0]
    bad = []
    for line, module in _imports(path, text):
        if module.split(".")[0] in ROS_MODULES:
            bad.append(f"{path.relative_to(ROOT)}:{line} imports ROS ({module})")
        target = _engine_package(module)
        if target is not None and target != own and LAYER[target] >= LAYER[own]:
            bad.append(f"{path.relative_to(ROOT)}:{line} ({own}) imports {module} ({target})")
    return bad


def _engine_package(module: str):
    parts = module.split(".")
    return parts[1] if parts[0] == "tensegrity_engine" and len(parts) > 1 and parts[1] in LAYER else None


def _sources(root: Path):
    return sorted(p for p in root.rglob("*.py") if "__pycache__" not in p.parts)


def test_every_engine_module_lives_in_a_concept_package():
    loose = [p.name for p in ENGINE.glob("*.py") if p.name != "__init__.py"]
    assert not loose, f"modules outside a concept package: {loose}"
    assert sorted(p.name for p in ENGINE.iterdir() if (p / "__init__.py").exists()) == sorted(LAYER)


def test_engine_imports_point_down_or_sideways_within_a_package():
    bad = [v for path in _sources(ENGINE) for v in _layer_violations(path)]
    assert not bad, "\n".join(bad)


def test_ros_nodes_and_tools_never_import_the_clis():
    bad = []
    for root in (ROOT / "tensegrity_ros", ROOT / "tools"):
        for path in _sources(root):
            bad += [f"{path.relative_to(ROOT)}:{line} imports {m}" for line, m in _imports(path)
                    if _engine_package(m) == "cli"]
    assert not bad, "\n".join(bad)


def test_no_class_is_a_monolith():
    big = []
    for path in _sources(ENGINE) + _sources(ROOT / "tensegrity_ros"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef) and node.end_lineno - node.lineno + 1 > MAX_CLASS_LINES:
                big.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name} "
                           f"({node.end_lineno - node.lineno + 1} lines)")
    assert not big, "\n".join(big)


@pytest.mark.parametrize("source", [
    "from tensegrity_engine.control import MPPIController\n",
    "def f():\n    from ..identification import trainer\n",
    "import rclpy\n",
    "from tensegrity_engine import cli\n",
])
def test_the_checker_sees_upward_and_ros_imports(source):
    """The layering check can fail: each of these in a physics module is reported."""
    probe = ENGINE / "physics" / "probe.py"
    assert _layer_violations(probe, source)
    assert not _layer_violations(probe, "from tensegrity_engine.physics import state\nimport torch\n")
