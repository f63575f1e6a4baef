"""launch/*.launch.py, config/sim2sim.yaml and config/robot.yaml.

The launch file is parsed and its description checked where ROS 2 `launch` /
`launch_ros` are importable (a ROS 2 install), and skipped with the reason otherwise
(they are not installable from PyPI: the PyPI package named `launch` is unrelated).
The static checks and the parameter-file check run without launch.
"""
import ast
import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
LAUNCH = ROOT / "launch" / "sim2sim.launch.py"
ROBOT_LAUNCH = ROOT / "launch" / "robot.launch.py"
CONFIG = ROOT / "config" / "sim2sim.yaml"
ROBOT_CONFIG = ROOT / "config" / "robot.yaml"
NODES = {"mujoco_bridge": ("mujoco_bridge", "tensegrity_ros.mujoco_bridge", "MujocoBridge"),
         "identifier": ("identifier", "tensegrity_ros.identifier_node", "IdentifierNode"),
         "mppi_controller": ("mppi_controller", "tensegrity_ros.mppi_controller", "MppiControllerNode"),
         "camera_tracker": ("camera_tracker", "tensegrity_ros.camera_tracker", "CameraTrackerNode")}


def _entry_points():
    text = (ROOT / "setup.py").read_text()
    return dict(re.findall(r'"([\w-]+) = ([\w.]+:\w+)"', text))


def _launched(path):
    """(package, executable) of every Node in a launch file."""
    tree = ast.parse(path.read_text())
    funcs = {n.name for n in tree.body if isinstance(n, ast.FunctionDef)}
    assert "generate_launch_description" in funcs
    calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call) and getattr(n.func, "id", None) == "Node"]
    kw = [{k.arg: k.value for k in c.keywords} for c in calls]
    return [(ast.literal_eval(k["package"]), ast.literal_eval(k["executable"])) for k in kw]


def test_robot_launch_starts_the_nodes_a_robot_needs():
    launched = _launched(ROBOT_LAUNCH)
    ours = sorted(exe for pkg, exe in launched if pkg == "tensegrity_ros")
    assert ours == ["identifier", "mppi_controller", "recorder"]            # no simulator
    assert ("rviz2", "rviz2") in launched
    eps = _entry_points()
    assert all(eps[exe] == f"tensegrity_ros.entry:{exe}" for exe in ours)
    text = ROBOT_LAUNCH.read_text()
    for arg in ("robot", "params_file", "device", "poses_topic", "command_topic", "identifier", "controller"):
        assert f'"{arg}"' in text, arg
    assert (ROOT / "rviz" / "tensegrity.rviz").exists()


def test_robot_yaml_has_the_sim2sim_layout_on_the_robot_clock():
    data, sim = yaml.safe_load(ROBOT_CONFIG.read_text()), yaml.safe_load(CONFIG.read_text())
    for name in ("identifier", "mppi_controller"):
        assert data[name]["ros__parameters"]["use_sim_time"] is False
        assert set(data[name]["ros__parameters"]) - set(sim[name]["ros__parameters"]) <= {
            "pose_timeout", "hold_command", "hold_on_rejected_model", "max_command_rate", "holdout_every"}


def test_launch_file_static():
    launched = _launched(LAUNCH)
    assert sorted(exe for pkg, exe in launched if pkg == "tensegrity_ros") == sorted(NODES)
    assert {pkg for pkg, _ in launched} <= {"tensegrity_ros", "rviz2"}
    eps = _entry_points()
    entry = (ROOT / "tensegrity_ros" / "entry.py").read_text()
    for name, (exe, module, cls) in NODES.items():
        # console scripts go through entry.py (signal handlers before the heavy imports)
        assert eps[exe] == f"tensegrity_ros.entry:{exe}"
        assert f'return _node("{module.split(".")[-1]}", "{cls}")' in entry
    assert "get_package_share_directory" in LAUNCH.read_text()
    for node in NODES:          # one robot argument reaches the bridge and every node that models it
        assert f'ModelRobot(params, "{node}", robot)' in LAUNCH.read_text(), node


def test_sim2sim_yaml_is_a_ros_parameter_file():
    data = yaml.safe_load(CONFIG.read_text())
    for name in NODES:
        assert "ros__parameters" in data[name], name
    assert data["identifier"]["ros__parameters"]["use_sim_time"] is True
    assert data["mppi_controller"]["ros__parameters"]["use_sim_time"] is True
    assert data["camera_tracker"]["ros__parameters"]["use_sim_time"] is True
    assert "use_sim_time" not in data["mujoco_bridge"]["ros__parameters"]   # the clock source


def test_yaml_keys_are_declared_parameters():
    """Every key of config/sim2sim.yaml is a parameter its node declares (no typos)."""
    rclpy = pytest.importorskip("rclpy", reason="rclpy not importable (ROS 2 wheels not installed)")
    pytest.importorskip("tensegrity_ros_interfaces.msg", reason="tensegrity_ros_interfaces not built")
    from rclpy.parameter import Parameter

    os.environ.setdefault("ROS_LOG_DIR", "/tmp/tensegrity_test_ros_log")
    os.environ["ROS_AUTOMATIC_DISCOVERY_RANGE"] = "LOCALHOST"
    ctx = rclpy.Context()
    from tensegrity_ros.common import reserve_domain_id

    rclpy.init(context=ctx, domain_id=reserve_domain_id())
    files = [(CONFIG, name) for name in NODES] + [(ROBOT_CONFIG, "identifier"), (ROBOT_CONFIG, "mppi_controller")]
    try:
        for path, name in files:
            _, module, cls_name = NODES[name]
            cls = getattr(importlib.import_module(module), cls_name)
            params = yaml.safe_load(path.read_text())[name]["ros__parameters"]
            over = [Parameter(k, value=v) for k, v in params.items() if k != "use_sim_time"]
            node = cls(context=ctx, parameter_overrides=over)
            try:
                declared = set(node._parameters)
                assert set(params) <= declared, (name, set(params) - declared)
                for k, v in params.items():
                    desc = node.describe_parameter(k)
                    assert desc.description or k == "use_sim_time", (name, k)
            finally:
                node.close()
                node.destroy_node()
    finally:
        rclpy.try_shutdown(context=ctx)


import importlib  # noqa: E402


def _launch_available():
    try:
        import launch
        import launch_ros  # noqa: F401
    except ImportError as exc:
        return f"ROS 2 launch not importable ({exc}); PyPI has no launch_ros"
    if not hasattr(launch, "LaunchDescription"):
        return "`launch` here is not ROS 2 launch (a namespace package or the unrelated PyPI project)"
    return None


@pytest.mark.skipif(_launch_available() is not None, reason=str(_launch_available()))
def test_launch_description_parses(tmp_path, monkeypatch):
    import launch
    import launch_ros.actions

    # make get_package_share_directory find this source tree as the package share
    share = tmp_path / "share"
    (share / "ament_index" / "resource_index" / "packages").mkdir(parents=True)
    (share / "ament_index" / "resource_index" / "packages" / "tensegrity_ros").write_text("")
    (share / "tensegrity_ros").mkdir()
    (share / "tensegrity_ros" / "config").symlink_to(ROOT / "config")
    monkeypatch.setenv("AMENT_PREFIX_PATH", f"{tmp_path}:{os.environ.get('AMENT_PREFIX_PATH', '')}")
    spec = importlib.util.spec_from_file_location("sim2sim_launch", LAUNCH)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    ld = mod.generate_launch_description()
    assert isinstance(ld, launch.LaunchDescription)
    nodes = [e for e in ld.entities if isinstance(e, launch_ros.actions.Node)]
    assert len(nodes) == 3
    assert (share / "tensegrity_ros" / "config" / "sim2sim.yaml").exists()


def test_sim2sim_reports_the_values_of_the_robot_the_bridge_plays():
    from tensegrity_engine.groundtruth.zoo import ground_truth, zoo_robot
    from tensegrity_engine.physics.config import ConfigError, load_robot
    from tensegrity_ros.sim2sim import true_values

    robot = load_robot("superball")
    twin = true_values(robot, "twin")
    assert float(twin["cable_stiffness"].mean()) == pytest.approx(float(robot.cable_stiffness.mean()))
    zoo = true_values(robot, "zoo/end_heavy")
    truth = zoo_robot("end_heavy", robot)
    np.testing.assert_allclose(zoo["rod_mass"], truth.truth.rod_mass)
    assert float(zoo["rod_inertia_factor"].mean()) > 1.5          # 60 % of the mass at the ends
    assert float(zoo["rod_mass"].mean()) != pytest.approx(float(robot.rod_mass.mean()))
    with pytest.raises(ConfigError):
        true_values(robot, "zoo/unicorn")
    # a drawn robot is a foreign one too: its realisation's values (an end-heavy draw's inertia)
    drawn = next(s for s in range(50) if ground_truth(f"random/{s}", robot).realisation.end_mass_fraction > 0.3)
    assert float(true_values(robot, f"random/{drawn}")["rod_inertia_factor"].mean()) > 1.5


@pytest.mark.parametrize("override,expected", [
    ("bridge:robot_truth:=zoo/kitchen_sink", "no node 'bridge' runs here; the nodes: mujoco_bridge"),
    ("camera_tracker:cameras:=2", "no node 'camera_tracker' runs here"),    # poses from mocap: no tracker
    ("identifier:max_seconds=30", "expected node:name:=value"),
])
def test_sim2sim_refuses_an_override_that_reaches_no_node(override, expected, tmp_path, capsys):
    """Before any node starts: an override for a node that does not run would be dropped."""
    from tensegrity_ros.sim2sim import main

    with pytest.raises(SystemExit) as exit_:
        main(["-p", override, "--output-dir", str(tmp_path), "--domain-id", "1"])
    assert exit_.value.code == 2
    assert expected in capsys.readouterr().err
    assert not list(tmp_path.iterdir())        # nothing ran, nothing written


@pytest.mark.parametrize("edit,expected", [
    (lambda d: d.update(identifer=d.pop("identifier")), "no node 'identifer' runs in the sim2sim"),
    (lambda d: d["sim2sim"]["ros__parameters"].update(goal_vz=0.5), "sim2sim has no setting 'goal_vz'"),
])
def test_sim2sim_refuses_a_parameter_file_section_or_setting_it_would_ignore(edit, expected, tmp_path, capsys):
    from tensegrity_ros.sim2sim import main

    data = yaml.safe_load(CONFIG.read_text())
    edit(data)
    path = tmp_path / "params.yaml"
    path.write_text(yaml.safe_dump(data))
    with pytest.raises(SystemExit) as exit_:
        main(["--config", str(path), "--output-dir", str(tmp_path / "out"), "--domain-id", "1"])
    assert exit_.value.code == 2
    assert expected in capsys.readouterr().err
    assert not (tmp_path / "out").exists()       # refused before anything ran


@pytest.mark.parametrize("args,expected", [
    (["--robot", "no_such_robot"], "config 'no_such_robot' not found"),
    (["-p", "mujoco_bridge:robot_truth:=zoo/unicorn"], "no zoo robot 'unicorn'"),
    (["--robot", "PASSIVE"], "no cable is actuated"),
    (["--robot", "TINY_MASS"], "outside the range the engine represents"),     # a node would fail on it
])
def test_sim2sim_refuses_a_robot_it_cannot_play_in_one_line(args, expected, tmp_path, capsys):
    from tensegrity_ros.sim2sim import main

    passive = yaml.safe_load((ROOT / "config" / "three_bar.yaml").read_text())
    passive["cable_defaults"]["actuated"] = False
    (tmp_path / "passive.yaml").write_text(yaml.safe_dump(passive))
    tiny = yaml.safe_load((ROOT / "config" / "three_bar.yaml").read_text())
    tiny["rod_defaults"]["mass"] = 1e-6
    (tmp_path / "tiny_mass.yaml").write_text(yaml.safe_dump(tiny))
    files = {"PASSIVE": "passive.yaml", "TINY_MASS": "tiny_mass.yaml"}
    args = [str(tmp_path / files[a]) if a in files else a for a in args]
    assert main(args + ["--output-dir", str(tmp_path / "out"), "--domain-id", "1"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("tensegrity-sim2sim: error: ") and expected in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1


def test_sim2sim_judges_unweighed_forces_per_unit_mass(capsys):
    """zoo/soft_slow's rods are 1.3x the config's and rod mass is not learnt: cable values
    identified exactly per unit mass are 1/1.3 of the truth, and the summary says they are
    right per unit mass (and to weigh the rods); with the mass learnt, or the robot's rods
    the config's, it says nothing."""
    from tensegrity_engine.physics.config import load_robot
    from tensegrity_engine.physics.params import nominal_values
    from tensegrity_ros.sim2sim import per_unit_mass, print_summary, true_values

    robot = load_robot("superball")
    truth, config = true_values(robot, "zoo/soft_slow"), nominal_values(robot)
    ratio = float(truth["rod_mass"].mean() / np.mean(config["rod_mass"]))
    assert ratio == pytest.approx(1.3)
    rows = [{"name": n, "true": float(truth[n].mean()), "identified": float(truth[n].mean()) / ratio * f}
            for n, f in (("cable_stiffness", 1.0), ("cable_damping", 1.05))]
    per = per_unit_mass(rows, truth, config)
    assert per["rel_error"] == pytest.approx({"cable_stiffness": 0.0, "cable_damping": 0.05}, abs=1e-12)
    assert per_unit_mass(rows + [{"name": "rod_mass", "true": 1.0, "identified": 1.0}], truth, config) is None
    assert per_unit_mass(rows, true_values(robot, "twin/as_built"), config) is None
    assert per_unit_mass(rows, true_values(robot, "zoo/payload"), config) is None     # one rod heavier: no scale
    print_summary({"wall_seconds": 1.0, "sim_seconds": 1.0, "poses": 10, "parameters_published": 1,
                   "final_stage": "converged", "parameters": [
                       {**r, "sigma": 1.0, "first_published": r["true"], "rel_error": abs(r["identified"] / r["true"] - 1)}
                       for r in rows], "per_unit_mass": per})
    out = capsys.readouterr().out
    assert "rod mass not learnt" in out and "(1.30x)" in out and "cable_damping +5.0%" in out


def test_the_summary_says_why_the_published_sigma_is_not_estimated(capsys):
    """The identifier's `uncertainty` diagnostic (read from /diagnostics) goes into the
    summary, which prints it unless the sigma was estimated: a column of inf then says why."""
    import threading
    from types import SimpleNamespace

    from tensegrity_ros.sim2sim import identifier_diagnostic, print_summary

    why = "inf: actuator_time_constant pinned at a bound, every value compensates"
    mon = SimpleNamespace(lock=threading.Lock(), diag={"identifier": {"uncertainty": why}})
    assert identifier_diagnostic(mon, "uncertainty") == why
    assert identifier_diagnostic(SimpleNamespace(lock=threading.Lock(), diag={}), "uncertainty") is None
    row = {"name": "cable_stiffness", "true": 1.0, "identified": 1.5, "first_published": 1.0, "rel_error": 0.5,
           "sigma": float("inf")}
    base = {"wall_seconds": 1.0, "sim_seconds": 1.0, "poses": 10, "parameters_published": 1,
            "final_stage": "converged", "parameters": [row]}
    for state, shown in ((why, True), ("estimated", False), (None, False)):
        print_summary({**base, "sigma_state": state})
        assert (f"the published 1-sigma: {why}" in capsys.readouterr().out) == shown


def test_sim2sim_models_a_foreign_robot_with_its_rods_weighed(tmp_path):
    """A zoo robot whose rods are 1.3x the config's and whose capsules are 0.6x as thick:
    the nodes that model it get the config with those masses and radii (a scale and a
    ruler), nothing else of the truth; the config's own twin needs no file; the launch file's
    lookup honours weigh_rods."""
    from tensegrity_engine.groundtruth.zoo import zoo_robot
    from tensegrity_engine.physics.config import load_robot
    from tensegrity_ros.sim2sim import MODEL_NODES, launch_robot, weighed_robot_file

    robot = load_robot("superball")
    assert weighed_robot_file(robot, "twin", tmp_path / "twin") is None
    assert not (tmp_path / "twin").exists()
    for name in ("soft_slow", "spring_driven"):
        path = weighed_robot_file(robot, f"zoo/{name}", tmp_path / name)
        model, truth = load_robot(str(path)), zoo_robot(name, robot).truth
        np.testing.assert_allclose(model.rod_mass, truth.rod_mass)
        np.testing.assert_allclose(model.rod_radius, truth.rod_radius)
        assert not np.allclose(model.rod_mass, robot.rod_mass) or not np.allclose(model.rod_radius, robot.rod_radius)
        for same in ("cable_stiffness", "cable_damping", "rod_inertia_factor", "cable_rest_length"):
            np.testing.assert_array_equal(getattr(model, same), getattr(robot, same))
        assert model.actuator == robot.actuator and model.contact == robot.contact
        assert model.integrator == robot.integrator

    data = yaml.safe_load(CONFIG.read_text())
    assert data["sim2sim"]["ros__parameters"]["weigh_rods"] is True
    assert set(MODEL_NODES) == set(NODES) - {"mujoco_bridge"}
    data["mujoco_bridge"]["ros__parameters"]["robot_truth"] = "zoo/soft_slow"
    params = tmp_path / "params.yaml"
    params.write_text(yaml.safe_dump(data))
    weighed_path = launch_robot(str(params), "identifier")
    weighed = load_robot(weighed_path)
    np.testing.assert_allclose(weighed.rod_mass, zoo_robot("soft_slow", robot).truth.rod_mass)
    data["sim2sim"]["ros__parameters"]["weigh_rods"] = False
    params.write_text(yaml.safe_dump(data))
    assert launch_robot(str(params), "identifier") == "superball"
    data["sim2sim"]["ros__parameters"]["weigh_rods"] = True
    data["mujoco_bridge"]["ros__parameters"]["robot_truth"] = "twin"
    params.write_text(yaml.safe_dump(data))
    assert launch_robot(str(params), "mppi_controller") == "superball"
    # the launch's folder goes when the launch process does (a process of its own here)
    script = (f"import sys; from pathlib import Path; from tensegrity_ros.sim2sim import launch_robot; "
              f"p = Path(launch_robot({str(params)!r}, 'identifier')); print(p); sys.exit(not p.is_file())")
    data["mujoco_bridge"]["ros__parameters"]["robot_truth"] = "zoo/soft_slow"
    params.write_text(yaml.safe_dump(data))
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    made = Path(run.stdout.strip())
    assert made.name == "robot_weighed.yaml" and not made.parent.exists()


def test_one_robot_argument_sets_the_played_and_the_modelled_robot(tmp_path):
    """``robot:=`` (the launch argument; `tensegrity-sim2sim --robot`) replaces the parameter
    file's robot in the bridge and in every node that models it: a four-bar played as a zoo
    robot is modelled by the four-bar with its rods weighed, never by the file's SUPERball."""
    from tensegrity_engine.groundtruth.zoo import zoo_robot
    from tensegrity_engine.physics.config import load_robot
    from tensegrity_ros.sim2sim import MODEL_NODES, launch_robot

    data = yaml.safe_load(CONFIG.read_text())
    assert data["mujoco_bridge"]["ros__parameters"]["robot"] == "superball"
    params = tmp_path / "params.yaml"
    for truth in ("twin", "zoo/soft_slow"):
        data["mujoco_bridge"]["ros__parameters"]["robot_truth"] = truth
        params.write_text(yaml.safe_dump(data))
        assert launch_robot(str(params), "mujoco_bridge", "four_bar") == "four_bar"
        assert launch_robot(str(params), "mujoco_bridge") == "superball"
        for node in MODEL_NODES:
            model = load_robot(launch_robot(str(params), node, "four_bar"))
            assert (model.name, model.num_rods, len(model.cable_names)) == ("four_bar", 4, 12)
            played = load_robot("four_bar") if truth == "twin" else zoo_robot("soft_slow", load_robot("four_bar")).truth
            np.testing.assert_allclose(model.rod_mass, played.rod_mass)
            assert load_robot(launch_robot(str(params), node)).num_rods == 6


def test_the_summary_says_which_structure_the_published_model_has(capsys):
    """A message's integrator and contact_condim (empty / 0: the consumer's own, > 0: the soft
    law) read on the nodes' robot: a penalty-law four-bar whose identifier adopted the soft
    law says so; the SUPERball's own soft law is the YAML's."""
    from tensegrity_engine.physics.config import load_robot
    from tensegrity_ros.sim2sim import print_summary, published_structure

    four, ball = load_robot("four_bar"), load_robot("superball")
    assert four.contact.law == "penalty" and ball.contact.law == "soft"
    assert published_structure(four, None) is None
    adopted = published_structure(four, ("", 6))
    assert (adopted["integrator"], adopted["contact_law"], adopted["condim"], adopted["adopted_online"]) == \
        (four.integrator, "soft", 6, True)
    assert published_structure(four, ("", 0))["adopted_online"] is False
    assert published_structure(ball, ("", 0)) == published_structure(ball, (ball.integrator, ball.contact.soft_condim))
    assert published_structure(ball, ("", 0))["adopted_online"] is False
    assert published_structure(ball, ("implicitfast", 0))["adopted_online"] is True
    base = {"wall_seconds": 1.0, "sim_seconds": 1.0, "poses": 10, "parameters_published": 1,
            "final_stage": "converged", "parameters": [], "per_unit_mass": None}
    print_summary({**base, "published_structure": adopted})
    assert (f"published model: {four.integrator} integrator, soft ground law (condim 6); adopted online "
            f"(the robot YAML: {four.integrator} integrator, penalty ground law)") in capsys.readouterr().out
    print_summary({**base, "published_structure": published_structure(ball, ("", 0))})
    assert "ground law (condim 6), the robot YAML's" in capsys.readouterr().out
