"""bench/discretisation.py: a robot whose motion at its step is MuJoCo's discretisation is
told from one whose motion has converged, and ``substeps`` converges it."""
import dataclasses
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import discretisation  # noqa: E402

from tensegrity_engine.groundtruth.zoo import ground_truth  # noqa: E402
from tensegrity_engine.physics.config import load_robot  # noqa: E402


def test_stiff_heavily_damped_cables_at_1_ms_are_mostly_the_step_and_substeps_converge_them():
    base = load_robot("superball")
    z = ground_truth("zoo/stiff_light", base)
    at_dt = dataclasses.replace(z, realisation=dataclasses.replace(z.realisation, substeps=1))
    coarse = discretisation.gaps(at_dt, finer=[10], reference=40, seconds=2.0)
    # at 1 ms the played motion is many chaos floors from its converged self, at dt / 10 less
    assert coarse[1] > 10 * coarse["chaos"] and coarse[10] < coarse[1] / 3
    played = discretisation.gaps(z, finer=[10], reference=80, seconds=2.0)      # the zoo's substeps (40)
    assert played[1] < coarse[1] / 10
    # the engine's twin (Euler at 1 ms on the config's cables) has converged at its step
    twin = discretisation.gaps(ground_truth("twin/as_built", base), finer=[10], reference=40, seconds=2.0)
    assert twin[1] < 3 * twin["chaos"]
