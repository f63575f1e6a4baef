"""The nodes as processes, started the way `ros2 run` / `ros2 launch` start them (the
console-script entry points): a bad parameter is one readable line and exit code 2; any
number of SIGINTs at any moment, start-up included, ends in exit 0 without a traceback
(`ros2 launch` without a terminal sends SIGINT twice)."""
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import pytest

pytest.importorskip("rclpy", reason="rclpy not importable (ROS 2 wheels not installed)")
pytest.importorskip("tensegrity_ros_interfaces.msg", reason="tensegrity_ros_interfaces not built")

from tensegrity_ros.common import release_domain_id, reserve_domain_id  # noqa: E402
from tensegrity_ros.sim2sim import clean_dds_shm  # noqa: E402

READY = {"identifier": "identifier on", "mppi_controller": "MPPI controller on",
         "mujoco_bridge": "MuJoCo bridge:"}


SPAWNED: list = []


@pytest.fixture
def node_env():
    domain = reserve_domain_id()
    log_dir = tempfile.mkdtemp(prefix="tensegrity_test_proc_")
    env = dict(os.environ, ROS_DOMAIN_ID=str(domain), ROS_AUTOMATIC_DISCOVERY_RANGE="LOCALHOST",
               ROS_LOG_DIR=log_dir, PYTHONUNBUFFERED="1")
    env.pop("ROS_LOCALHOST_ONLY", None)
    try:
        yield env
    finally:
        while SPAWNED:                 # a failed test must not leave its node running
            proc = SPAWNED.pop()
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        release_domain_id(domain)
        clean_dds_shm()
        shutil.rmtree(log_dir, ignore_errors=True)      # the nodes' logs and stderr files


def spawn(entry: str, env: dict, *ros_args: str) -> subprocess.Popen:
    """The entry point in a new process; its stderr (where rclpy logs) goes to a file."""
    code = (f"import sys; sys.argv[0] = {entry!r}; from tensegrity_ros.entry import {entry}; "
            f"sys.exit({entry}())")
    args = ["--ros-args", *ros_args] if ros_args else []
    err = tempfile.NamedTemporaryFile("w+", prefix=f"{entry}_", suffix=".err", dir=env["ROS_LOG_DIR"],
                                      delete=False)
    proc = subprocess.Popen([sys.executable, "-c", code, *args], env=env, stdout=subprocess.DEVNULL,
                            stderr=err, start_new_session=True)
    proc.err_path = err.name
    err.close()
    SPAWNED.append(proc)
    return proc


def stderr_of(proc: subprocess.Popen) -> str:
    with open(proc.err_path) as fh:
        return fh.read()


def finish(proc: subprocess.Popen, timeout: float = 60.0) -> tuple[int, str]:
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        pytest.fail(f"still running {timeout} s after the signal (hung):\n{stderr_of(proc)[-2000:]}")
    return proc.returncode, stderr_of(proc)


@pytest.mark.parametrize("entry,override,expected", [
    ("identifier", "lr0:=100.0", "parameter lr0=100.0 is outside [1e-06, 10.0]"),
    ("mppi_controller", "planner:=foo", "parameter planner='foo': must be one of"),
    ("mppi_controller", "excitation_fmin:=3.0", "excitation_fmin (3 Hz) is above excitation_fmax (2 Hz)"),
    ("identifier", "robot:=/nonexistent/robot.yaml", "config '/nonexistent/robot.yaml' not found"),
    ("identifier", "learn:=[cable_stifness]", "parameter learn: unknown parameter(s) to learn: cable_stifness"),
    ("identifier", "structure_options:=[per_joint]",
     "parameter structure_options: structure option 'per_joint' cannot be tried online"),
    ("identifier", "learn:=[cable_stiffness,cable_damping,rod_mass]",
     "parameter learn: cable_stiffness, cable_damping, rod_mass scale together"),
    ("identifier", "max_holdout:=20", "keep at least 30"),
    ("mppi_controller", "plan_budget:=0.2", "plan_budget (0.2 s) must be below the control period (0.1 s)"),
    ("mujoco_bridge", "robot_truth:=zoo/unicorn", "robot_truth 'zoo/unicorn'"),
    # rclpy alone keeps an undeclared override and runs with the default
    ("identifier", "max_secnds:=30", "declares no parameter max_secnds (did you mean max_seconds"),
    ("mppi_controller", "goal_speed:=2.0", "declares no parameter goal_speed"),
])
def test_bad_parameter_is_one_line_and_exit_code_2(node_env, entry, override, expected):
    rc, err = finish(spawn(entry, node_env, "-p", override))
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert rc == 2, (rc, err)
    assert len(lines) == 1, err
    assert lines[0].startswith(f"{entry}: ") and expected in lines[0], lines[0]


def _wait_ready(proc: subprocess.Popen, marker: str, timeout: float = 60.0) -> None:
    """Until the node logged its start-up line."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and proc.poll() is None:
        if marker in stderr_of(proc):
            return
        time.sleep(0.05)
    pytest.fail(f"{marker!r} never logged:\n{stderr_of(proc)[-2000:]}")


def test_a_robot_mujoco_cannot_simulate_stops_the_bridge_in_one_line(node_env, tmp_path):
    """A 0.1 s step: the robot diverges while it settles into its rest pose (before that,
    a traceback)."""
    import yaml

    from tensegrity_engine.physics.config import CONFIG_DIR

    data = yaml.safe_load((CONFIG_DIR / "three_bar.yaml").read_text())
    data["engine"]["dt"] = 0.1
    path = tmp_path / "coarse.yaml"
    path.write_text(yaml.safe_dump(data))
    rc, err = finish(spawn("mujoco_bridge", node_env, "-p", f"robot:={path}", "-p", "robot_truth:=twin"))
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert rc == 2, (rc, err)
    # MuJoCo's own warning may come first
    assert lines[-1].startswith("mujoco_bridge: ") and "MuJoCo diverged" in lines[-1], err
    assert "Traceback" not in err


@pytest.mark.parametrize("entry", sorted(READY))
def test_every_parameter_a_node_declares_is_accepted(node_env, entry):
    """The undeclared-parameter check runs once the node has declared everything: a value
    given for its last declaration (the diagnostics period, declared by `Diagnostics`) and
    one of its first (robot) start it."""
    proc = spawn(entry, node_env, "-p", "diagnostics_period:=2.0", "-p", "robot:=superball")
    _wait_ready(proc, READY[entry])
    proc.send_signal(signal.SIGINT)
    rc, err = finish(proc)
    assert rc == 0, err
    assert "declares no parameter" not in err


@pytest.mark.parametrize("entry,moment", [
    ("identifier", 0.3),          # interpreter start-up, imports
    ("identifier", 1.2),          # torch / engine imports, node construction
    ("identifier", "running"),
    ("mppi_controller", "running"),
    ("mujoco_bridge", "running"),
])
def test_repeated_sigints_at_any_moment_exit_0_without_traceback(node_env, entry, moment):
    """SIGINT every 10 ms until the node is gone: signals land in its cleanup and in
    Python's finalisation too, not only in the spin loop."""
    proc = spawn(entry, node_env)
    if moment == "running":
        _wait_ready(proc, READY[entry])
    else:
        time.sleep(moment)
    assert proc.poll() is None, "the node exited before the signal"
    deadline = time.monotonic() + 60.0
    sent = 0
    while proc.poll() is None and time.monotonic() < deadline:
        try:
            proc.send_signal(signal.SIGINT)
            sent += 1
        except ProcessLookupError:
            break
        time.sleep(0.01)
    rc, err = finish(proc)
    assert sent >= 2
    assert rc == 0, (rc, err[-2000:])
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err[-2000:]
