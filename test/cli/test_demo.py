"""tensegrity-demo: the engine and MuJoCo agree to round-off without contacts, and the demo
says when rods touch each other (where the two rod-rod contact models differ by design)."""
import re

import numpy as np

from tensegrity_engine.cli import demo
from tensegrity_engine.physics.collision import rods_overlapping
from tensegrity_engine.physics.config import load_robot
from tensegrity_engine.physics.state import initial_rod_state


def test_rods_overlapping_reads_the_capsules_overlap():
    robot = load_robot("four_bar")
    state = initial_rod_state(robot)
    assert not rods_overlapping(robot, state[None]).any()          # the prism's rods 22 cm apart
    folded = state.copy()
    folded[1, :3] = folded[0, :3]                                   # rod 1's centre on rod 0's
    assert rods_overlapping(robot, np.stack([state, folded])).tolist() == [False, True]


def test_the_four_bar_agrees_to_round_off_until_its_rods_touch(capsys):
    """Random commands fold the four-bar's rods into each other within 0.5 s; until then
    the two simulations are the same physics."""
    demo.main(["--robot", "four_bar", "--seconds", "1"])
    out = capsys.readouterr().out
    found = re.search(r"rods touched each other on (\d+) of \d+ steps, first after ([\d.]+) s.*"
                      r"CoM error until then ([\d.e+-]+) m", out)
    assert found, out
    assert int(found.group(1)) > 0 and 0 < float(found.group(2)) < 1.0
    assert float(found.group(3)) < 1e-12
