"""The online bench's printed medians (bench/online.py): a run whose model diverged on the
fresh data counts as the largest error, never as no run."""
import math
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import online  # noqa: E402


def test_a_run_whose_model_diverged_counts_as_the_largest_error_in_the_median():
    assert online._median_diverged_last([0.01, 0.02, math.inf]) == 0.02      # not 0.015 over two runs
    assert online._median_diverged_last([0.01, math.inf, math.inf]) == math.inf
    assert online._median_diverged_last([0.01, 0.03, math.nan]) == 0.02      # a run not scored: left out
    assert math.isnan(online._median_diverged_last([math.nan, math.nan]))     # no fresh data scored


def test_the_objective_line_counts_where_the_robots_values_fit_the_windows_better(capsys):
    """Solver short of the minimum where the robot's values (either set) fit better; the
    minimum away from the robot where neither does; a run without both objectives left out."""
    def run(robot, identified, true, true_contact=math.nan):
        return {"robot": robot, "training_objective": {"identified": identified, "true": true,
                                                       "true_contact": true_contact}}
    online._objective_line([run("a", 0.03, 0.04, 0.02),      # only with the robot's contact: short
                            run("b", 0.03, 0.02),            # short
                            run("c", 0.03, 0.04, 0.05),      # the minimum is away from the robot
                            run("d", 0.03, math.nan),        # no truth scored: left out
                            run("e", math.nan, 0.02)])       # another structure published: left out
    out = capsys.readouterr().out
    assert "better than the published ones on 2 of 3 runs (a, b:" in out
    assert "worse on 1 (c:" in out


def test_the_line_to_the_robots_values_moves_only_its_names_and_is_geometric_in_positive_values():
    start = {"cable_stiffness": [8000.0, 12000.0], "offset": [-0.01], "rod_mass": [10.0]}
    end = {"cable_stiffness": [16000.0, 3000.0], "offset": [0.03]}
    mid = online.line_values(start, end, 0.5)
    assert mid["cable_stiffness"] == pytest.approx([(8000 * 16000) ** 0.5, 6000.0])
    assert mid["offset"] == pytest.approx([0.01])      # a sign change: linear
    assert mid["rod_mass"] == [10.0]                   # not on the line: as published
    assert online.line_values(start, end, 1.0)["cable_stiffness"] == pytest.approx([16000, 3000])


def test_the_profile_line_tells_a_slope_from_a_ridge(capsys):
    """A run whose objective falls from the published values toward the robot's stopped on a
    slope (its lowest point at the robot's values, or short of them); one with a rise before
    the lowest point has a ridge between (even where the robot's values fit better); a run
    where the published values fit better, or without a profile, is not counted."""
    def run(robot, seed, profile):
        f = dict(profile)
        return {"robot": robot, "seed": seed, "training_objective": {"identified": f[0.0], "true": f[1.0],
                                                                     "profile": profile}}
    slope = [(0.0, 0.030), (0.25, 0.029), (0.5, 0.028), (0.75, 0.027), (1.0, 0.026), (1.25, 0.027)]
    short = [(0.0, 0.030), (0.25, 0.029), (0.5, 0.025), (0.75, 0.024), (1.0, 0.026), (1.25, 0.027)]
    ridged = [(0.0, 0.030), (0.25, 0.031), (0.5, 0.029), (0.75, 0.027), (1.0, 0.026), (1.25, 0.025)]
    away = [(0.0, 0.030), (0.25, 0.031), (0.5, 0.032), (0.75, 0.033), (1.0, 0.034), (1.25, 0.035)]
    assert online.ridge(slope) is None and online.line_lowest(slope) == 1.0     # 1.25 does not count
    assert online.ridge(short) is None and online.line_lowest(short) == 0.75   # the rise after the lowest
    assert online.ridge(ridged) == 0.25
    online._profile_line([run("a", 0, slope), run("b", 1, ridged), run("c", 2, away), run("e", 4, short),
                          {"robot": "d", "seed": 3, "training_objective": {"identified": 0.03, "true": 0.02}}])
    out = capsys.readouterr().out
    assert "of the 3 runs whose robot's values fit the training windows better" in out
    assert "toward the robot's on 2 (a 0, e 4: the solver stopped on a slope; lowest at the robot's values on 1, " \
           "short of them on 1)" in out
    assert "has a ridge between on 1 (b 1: another basin)" in out
    assert "a ridge before s = 0.25" in online._profile_text(ridged)
    assert "falls to its lowest at s = 0.75" in online._profile_text(short)
    assert "falls all the way" in online._profile_text(slope)
    beyond = slope[:-1] + [(1.25, 0.025)]                 # still falling past the robot's values
    assert online.line_lowest(beyond) == 1.0 and "falls all the way" in online._profile_text(beyond)
    assert "lowest at the published values" in online._profile_text(away)
    online._profile_line([{"robot": "d", "seed": 3, "training_objective": {"identified": 0.03, "true": 0.02}}])
    assert capsys.readouterr().out == ""                  # no profiles: no line
