"""Every command-line tool given a robot it cannot use says so in one line and exits 2
(no traceback): a user's own YAML with a typo is the first thing a new robot meets."""
import importlib

import pytest
import yaml

from tensegrity_engine.physics.config import CONFIG_DIR

TOOLS = [
    ("tensegrity_engine.cli.demo", ["--seconds", "0.01"]),
    ("tensegrity_engine.cli.control", ["--out", "OUT"]),
    ("tensegrity_engine.cli.track", ["--camera", "OUT"]),
    ("tensegrity_engine.cli.identify", ["generate", "--out", "OUT"]),
]


def _robot_file(tmp_path, kind):
    data = yaml.safe_load((CONFIG_DIR / "three_bar.yaml").read_text())
    if kind == "TYPO":
        data["actuator"]["max_sped"] = 0.25
    else:               # a value no model of the engine can hold: it would fail mid-run
        data["actuator"]["time_constant"] = 1e-9
    path = tmp_path / f"{kind}.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


@pytest.mark.parametrize("module,args", TOOLS, ids=[m.rsplit(".", 1)[1] for m, _ in TOOLS])
@pytest.mark.parametrize("robot,expected", [("no_such_robot", "'no_such_robot' not found"),
                                            ("TYPO", "unknown key 'max_sped' (did you mean 'max_speed'?)"),
                                            ("RANGE", "actuator_time_constant = [1e-09] in the robot config is "
                                                      "outside the range the engine represents")])
def test_a_robot_the_tool_cannot_use_is_one_line_and_exit_2(module, args, robot, expected, tmp_path, capsys):
    robot = str(_robot_file(tmp_path, robot)) if robot in ("TYPO", "RANGE") else robot
    args = [str(tmp_path / "out") if a == "OUT" else a for a in args]
    main = importlib.import_module(module).main
    assert main(args + ["--robot", robot]) == 2
    err = capsys.readouterr().err
    assert expected in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1, err
