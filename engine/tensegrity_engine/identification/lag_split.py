"""Whether the data tell the motors' lag from the cables' (ROS-free).

A rest length commanded through a first-order motor (time constant tau) into a cable whose
damping c acts beside its stiffness k (a Kelvin-Voigt lag c / k) is two lags in series. For
motion the commands drive, the response is symmetric in the two: the data fix their sum and
tell them apart only through motion the commands do not drive (impacts, the structure's own
oscillation), which 10 Hz poses barely see where the cables' modes are fast. Measured
(`bench/online.py --robot four_bar`, the twelve drawn robots with the mocap's noise,
2026-12-05): tau + c / k within 3.0 % of the truth on all twelve (median 1.4 %), while c and
tau were 46 / 27 % off (median); on five of them the fit put the larger lag on the other side.

`swapped_lags` is a fit's mirror image under that near-symmetry: the second start that
`online_structure`'s ``swapped_lags`` option fits; `bench/online.py` prints the sum
(`motor_and_cable_lags`) identified against the truth. `check_lag_split` scores a fit and
its mirror on the same training windows: where the mirror fits them about as well (no
significant per-window log ratio), the split is undetermined and the published sigma of c and
tau reaches the mirror (`ParameterUncertainty.sigma_split`): a local sigma is as narrow at an
exchanged split as at the true one (random/9: c's 4.3 % at +474 %).
"""
from __future__ import annotations

import dataclasses
import math
from typing import Optional

import numpy as np

from tensegrity_engine.physics.params import SPEC_BY_NAME

__all__ = ["LagSplit", "check_lag_split", "motor_and_cable_lags", "swapped_lags", "LAG_SWAP_MIN_RATIO",
           "SPLIT_SIGNIFICANCE", "SPLIT_WINDOWS"]

# Lags closer than this ratio are one start, not two: the exchange is not worth a look
LAG_SWAP_MIN_RATIO = 1.5
# The mirror fits the training windows worse by this many standard errors of the mean
# per-window log ratio: the data determine the split (the structure test's 2, `online_structure`)
SPLIT_SIGNIFICANCE = 2.0
# at most this many training windows scored (an even subset; two window fits per estimate:
# 3.2 s each for the SUPERball's windows of 3 x 100 ms on a 2-core CPU running four processes)
SPLIT_WINDOWS = 16


def motor_and_cable_lags(values: dict) -> Optional[tuple[float, float]]:
    """(the motors' time constant, the cables' mean Kelvin-Voigt lag c / k) in s, or None
    without the three values."""
    k = np.asarray(values.get("cable_stiffness", ()), dtype=np.float64)
    c = np.asarray(values.get("cable_damping", ()), dtype=np.float64)
    tau = np.asarray(values.get("actuator_time_constant", ()), dtype=np.float64)
    if k.size == 0 or c.size == 0 or tau.size != 1:
        return None
    return float(tau[0]), float(np.mean(c / k))


def swapped_lags(values: dict) -> Optional[dict]:
    """``values`` with the motor's lag and the cables' exchanged, or None where the two are
    within `LAG_SWAP_MIN_RATIO` of each other or the exchange leaves a value's range. The
    cables keep their damping profile (scaled to a mean lag tau); the motor gets their mean
    lag. Measured (the four-bar's drawn robots, `bench/online.py --noise drops`): the fits at
    +150 to +470 % damping kept tau + c / k within 3 % of the truth's with the two lags
    exchanged, and one of them fitted its training windows 8x worse than the true values: a
    local minimum the mirror start (`online_structure`'s ``swapped_lags``) leaves."""
    lags = motor_and_cable_lags(values)
    if lags is None:
        return None
    motor_lag, cable_lag = lags
    if not (cable_lag > 0 and motor_lag > 0) or max(cable_lag, motor_lag) < LAG_SWAP_MIN_RATIO * min(cable_lag, motor_lag):
        return None
    damping = np.asarray(values["cable_damping"], dtype=np.float64) * (motor_lag / cable_lag)
    spec_c, spec_tau = SPEC_BY_NAME["cable_damping"], SPEC_BY_NAME["actuator_time_constant"]
    if not (spec_c.lower < damping.min() and damping.max() < spec_c.upper
            and spec_tau.lower < cable_lag < spec_tau.upper):
        return None
    return {**values, "cable_damping": damping.tolist(), "actuator_time_constant": [cable_lag]}


@dataclasses.dataclass(frozen=True)
class LagSplit:
    """A fit's two lags and how much worse its mirror fits the same training windows."""
    motor: float             # s, the motors' time constant
    cable: float             # s, the cables' mean c / k
    mirror: dict             # the values with the two exchanged (`swapped_lags`)
    log_ratio: float         # mean over the windows of log(the mirror's error / the fit's)
    t: float                 # ``log_ratio`` over its standard error
    windows: int

    @property
    def determined(self) -> bool:
        return self.t >= SPLIT_SIGNIFICANCE

    def sigma(self, values: dict) -> dict:
        """{cable_damping, actuator_time_constant: 1-sigma per element}, empty where the split
        is determined; else |mirror - fit| / sqrt 2 (two values the data hold about equally
        likely, scored about one of them): twice it reaches the mirror."""
        if self.determined:
            return {}
        return {n: np.abs(np.asarray(self.mirror[n], dtype=np.float64) - np.asarray(values[n], dtype=np.float64))
                / math.sqrt(2.0) for n in ("cable_damping", "actuator_time_constant")}


def check_lag_split(run, values: dict, width: int, max_windows: int = SPLIT_WINDOWS) -> Optional[LagSplit]:
    """The fit ``values`` and its mirror (`swapped_lags`) scored on the same training windows
    of ``run`` (a `ProgressiveTrainer` with pose-only data; `acceptance.window_fit`, the
    windows those that have settled under the slower of the two motors); None without both
    lags, without a mirror or with fewer than three windows."""
    from tensegrity_engine.identification.acceptance import window_fit    # acceptance imports the solvers

    mirror = swapped_lags(values)
    if mirror is None:
        return None
    motor, cable = motor_and_cable_lags(values)
    slower = values if motor >= cable else mirror
    fit = window_fit(run, values, width, max_windows, settle_values=slower)
    other = window_fit(run, mirror, width, max_windows, settle_values=slower)
    if fit.size < 3 or other.shape != fit.shape:
        return None
    tiny = np.finfo(np.float64).tiny
    d = np.log(np.maximum(other, tiny)) - np.log(np.maximum(fit, tiny))
    mean, se = float(d.mean()), float(d.std(ddof=1)) / math.sqrt(d.size)
    t = mean / se if se > 0 else math.copysign(math.inf, mean) if mean else 0.0
    return LagSplit(motor, cable, mirror, mean, t, int(d.size))
