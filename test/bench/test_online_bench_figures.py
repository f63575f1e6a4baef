"""The online bench's printed medians (bench/online.py): a run whose model diverged on the
fresh data counts as the largest error, never as no run."""
import math
import sys
from pathlib import Path

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
