"""`colcon build` of this package, plain and with --symlink-install (the usual development
build), as a ROS 2 user runs it: the install tree has the launch files, configs, package
index entry and every console script under lib/tensegrity_ros, and a node started from
the install imports the installed package (not the source checkout)."""
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("colcon_core", reason="colcon not installed (colcon-common-extensions, tools/ros/requirements.txt)")

ROOT = Path(__file__).resolve().parents[2]
COLCON = Path(sys.executable).with_name("colcon")


def console_scripts() -> set:
    return set(re.findall(r'"([\w-]+) = [\w.]+:\w+"', (ROOT / "setup.py").read_text()))


@pytest.mark.parametrize("mode", ["plain", "symlink"])
def test_colcon_build_installs_everything(tmp_path, mode):
    base = ["--build-base", str(tmp_path / "build"), "--install-base", str(tmp_path / "install")]
    cmd = [str(COLCON), "--log-base", str(tmp_path / "log"), "build", "--base-paths", str(ROOT),
           "--packages-select", "tensegrity_ros", *base] + (["--symlink-install"] if mode == "symlink" else [])
    env = dict(os.environ, PATH=f"{COLCON.parent}{os.pathsep}{os.environ.get('PATH', '')}")
    done = subprocess.run(cmd, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]

    prefix = tmp_path / "install" / "tensegrity_ros"
    share = prefix / "share" / "tensegrity_ros"
    assert (prefix / "share" / "ament_index" / "resource_index" / "packages" / "tensegrity_ros").exists()
    assert (share / "package.xml").exists()
    assert {p.name for p in (share / "launch").iterdir()} == {p.name for p in (ROOT / "launch").glob("*.py")}
    assert {p.name for p in (share / "config").iterdir()} == {p.name for p in (ROOT / "config").glob("*.yaml")}
    assert (share / "rviz" / "tensegrity.rviz").exists()
    assert {p.name for p in (prefix / "lib" / "tensegrity_ros").iterdir()} == console_scripts()

    # a node from the install, in the install's environment, outside the checkout
    script = prefix / "lib" / "tensegrity_ros" / "identifier"
    probe = ("import tensegrity_ros, tensegrity_engine; "
             "print(tensegrity_ros.__file__); print(tensegrity_engine.__file__)")
    run = (f"source {tmp_path / 'install' / 'setup.bash'} && {sys.executable} -c '{probe}' && "
           f"{script} --ros-args -p lr0:=100.0")
    out = subprocess.run(["bash", "-c", run], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    paths = out.stdout.split()
    assert len(paths) == 2 and all(str(tmp_path) in p for p in paths), out.stdout + out.stderr
    assert out.returncode == 2 and "parameter lr0=100.0 is outside" in out.stderr, out.stderr
