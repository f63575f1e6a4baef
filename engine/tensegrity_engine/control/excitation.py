"""Excitation for identification data before a model exists."""
from __future__ import annotations

import numpy as np

from tensegrity_engine.physics.config import RobotConfig


KINDS = ("multisine", "chirp", "steps")
# The excitation's band (Hz) unless one is given (the controller node's excitation_fmin / fmax)
DEFAULT_BAND = (0.2, 2.0)
# Each cable's step schedule repeats after at least this long (s): a few hundred levels.
STEPS_PERIOD = 600.0


class ExcitationPolicy:
    """Smooth random excitation for identification data (no model needed).

    Each actuated cable follows ``mid + amp * sum_j a_j sin(2 pi f_j t + phi_j)`` with
    ``num_sines`` random frequencies log-uniform in ``freq_range`` Hz, random phases and
    weights (normalised so the sum stays within +-1), ``amp = amplitude * width / 2`` around
    the range centre ``mid``; ``kind="chirp"`` instead sweeps each cable's frequency
    log-linearly from ``freq_range[0]`` to ``freq_range[1]`` over ``duration`` s and back
    over the next, again and again (random phase); ``kind="steps"`` holds each cable at a random level in the same band for a
    random time uniform in [1 / (2 f_hi), 1 / (2 f_lo)] s, then jumps: the classic
    identification input for what acts within a step (a motor time constant shorter than
    the sampling interval, damping, a winch speed limit), which smooth signals hardly
    excite. Always inside the command range. Same call as `MPPIController`:
    ``plan(rod_state, act) -> command`` (state ignored), one call per ``control_dt``; or
    `command_at(t)` for any time, `commands(num_steps, dt)` for a whole open-loop run.
    """

    def __init__(self, robot: RobotConfig, *, seed: int = 0, kind: str = "multisine",
                 amplitude: float = 0.8, freq_range=DEFAULT_BAND, num_sines: int = 3,
                 control_dt: float = 0.1, duration: float = 5.0):
        if kind not in KINDS:
            raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")
        if not 0.0 < amplitude <= 1.0:
            raise ValueError("amplitude must be in (0, 1]")
        if not 0.0 < float(freq_range[0]) <= float(freq_range[1]):
            raise ValueError(f"freq_range must be (f_min, f_max) with 0 < f_min <= f_max Hz, got {tuple(freq_range)}")
        if not float(duration) > 0.0:
            raise ValueError(f"duration must be > 0 s, got {duration}")
        self.robot, self.kind, self.seed = robot, kind, int(seed)
        self.amplitude, self.freq_range = float(amplitude), tuple(float(f) for f in freq_range)
        self.num_sines, self.control_dt, self.duration = int(num_sines), float(control_dt), float(duration)
        self.low, self.high = robot.command_low, robot.command_high
        self.reset()

    def reset(self) -> None:
        rng = np.random.default_rng(self.seed)
        A = self.robot.num_actuated
        lo, hi = np.log(self.freq_range[0]), np.log(self.freq_range[1])
        self._freq = np.exp(rng.uniform(lo, hi, (A, self.num_sines)))
        self._phase = rng.uniform(0, 2 * np.pi, (A, self.num_sines))
        w = rng.uniform(0.5, 1.0, (A, self.num_sines))
        self._weight = w / w.sum(-1, keepdims=True)
        if self.kind == "steps":
            shortest, longest = 0.5 / self.freq_range[1], 0.5 / self.freq_range[0]
            count = int(np.ceil(STEPS_PERIOD / shortest)) + 1
            holds = rng.uniform(shortest, longest, (A, count))
            self._switch = np.concatenate([np.zeros((A, 1)), np.cumsum(holds, -1)[:, :-1]], -1)   # [A, count]
            self._level = rng.uniform(-1.0, 1.0, (A, count))
            # each cable repeats after its first switch past STEPS_PERIOD: whole holds only
            self.period = np.array([sw[np.searchsorted(sw, STEPS_PERIOD)] for sw in self._switch])
        self._t = 0.0

    def command_at(self, t) -> np.ndarray:
        """Commands [..., A] at times t (s, scalar or array)."""
        t = np.asarray(t, dtype=np.float64)[..., None, None]
        if self.kind == "multisine":
            s = (self._weight * np.sin(2 * np.pi * self._freq * t + self._phase)).sum(-1)
        elif self.kind == "steps":
            s = np.stack([level[np.searchsorted(switch, np.mod(t[..., 0, 0], period), side="right") - 1]
                          for switch, level, period in zip(self._switch, self._level, self.period)], -1)
        else:
            s = np.sin(self._chirp_phase(t[..., 0]) + self._phase[:, 0])
        mid, half = 0.5 * (self.low + self.high), 0.5 * (self.high - self.low)
        return np.clip(mid + self.amplitude * half * s, self.low, self.high)

    def _chirp_phase(self, t: np.ndarray) -> np.ndarray:
        """The sweep's phase at times ``t``: up from f_min to f_max over ``duration``, down
        again over the next, and so on (a sweep that went on rising left the command stream's
        band within seconds and overflowed to NaN), continuous at every turn."""
        f0, f1 = self.freq_range
        D = self.duration
        k = np.log(f1 / f0) / D

        def up(tau):                     # the rising sweep's phase after tau s (constant f0 if f1 = f0)
            return 2 * np.pi * f0 * (np.expm1(k * tau) / k if k > 0 else tau)
        turns, r = np.divmod(t, 2 * D)
        return turns * 2 * up(D) + np.where(r <= D, up(np.minimum(r, D)), 2 * up(D) - up(np.clip(2 * D - r, 0, D)))

    def commands(self, num_steps: int, dt: float) -> np.ndarray:
        """[S, A] commands at every step of length dt from t = 0."""
        return self.command_at(np.arange(num_steps) * dt)

    def plan(self, rod_state=None, act=None) -> np.ndarray:
        u = self.command_at(self._t)
        self._t += self.control_dt
        return u

    __call__ = plan
