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
