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
(`motor_and_cable_lags`) identified against the truth.
"""
from __future__ import annotations

from typing import Optional

import numpy as np

from tensegrity_engine.physics.params import SPEC_BY_NAME

__all__ = ["motor_and_cable_lags", "swapped_lags", "LAG_SWAP_MIN_RATIO"]

# Lags closer than this ratio are one start, not two: the exchange is not worth a look
LAG_SWAP_MIN_RATIO = 1.5


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
