"""Whether a winch speed limit the windowed solver settled with still pays for itself.

The speed-limit search (`scale.speed_limit_search`) runs on the first data, at whatever
actuator time constant the run then has, and keeps a limit if one fits better there: a
limit that binds has a gradient, so the solver can move it, and a robot with a real limit
needs that start (kitchen_sink's 0.5 m/s, lost when a limit had to win at its best tau on
the first data). But slow motors look like a limit at the config's tau too (spring_driven:
motors 2.5x slower than the config, 0.34 m/s taken), and a solver started from it can
settle in a basin where the limit and a wrong tau compensate each other: its windows then
fit the truth better than the basin (0.0437 against 0.0471), which no local step reaches.
So when the windowed stage settles with a limit that can bind, the same windows are scored
without it, tau searched along a log line, the latents refitted; the limit goes only if
that fits them better by what the solver counts as progress.
"""
from __future__ import annotations

import math
from typing import Optional

import numpy as np
import torch

from tensegrity_engine.identification.scale import log_line_search
from tensegrity_engine.identification.solvers.levenberg_marquardt import raw_vector, set_raw_vector
from tensegrity_engine.physics.actuators import speed_limit_binds
from tensegrity_engine.physics.config import DEFAULT_MAX_SPEED

LIMIT = "actuator_max_speed"
TAU = "actuator_time_constant"
TAU_OCTAVES = 2.0          # tau searched within 2^-2 .. 2^2 of the settled value
TAU_PER_OCTAVE = 2
REFIT_ITERATIONS = 4       # Gauss-Newton iterations of the latents at the limit-free values


@torch.no_grad()
def drop_speed_limit(run, windows: torch.Tensor, vel: torch.Tensor, refit) -> Optional[tuple[float, torch.Tensor]]:
    """The windowed objective and latents without the speed limit if that fits ``windows``
    better (the values then stay so: the config's "no limit", tau at its best), else
    None (the values as they were). ``refit(p, vel)``: the windows' latents fitted at values
    ``p`` from ``vel``."""
    if LIMIT not in run.learn or TAU not in run.learn:
        return None
    p = run.engine.param_values(run.dtype, run.device)
    span = run.objective.cmd_high - run.objective.cmd_low
    if not speed_limit_binds(p[TAU], p[LIMIT], span):
        return None
    theta0 = raw_vector(run.params, run.learn)

    def objective(latents: torch.Tensor) -> float:
        r = run.objective.window_residual(run.train, windows, latents, run.engine.param_values(run.dtype, run.device))
        f = float((r ** 2).sum())
        return f if math.isfinite(f) else math.inf

    _, limit_hi = run.params.bounds_of(LIMIT)
    if not DEFAULT_MAX_SPEED < limit_hi:        # bounds that leave no "none" (a user's): nothing to test
        return None
    tau_lo, tau_hi = run.params.bounds_of(TAU)

    def apply(s: float) -> None:
        run.params.set_value(TAU, (tau0 * s).clamp(tau_lo * (1 + 1e-6), tau_hi * (1 - 1e-6)).cpu().numpy())

    dropped = False
    try:
        # the fit as it is, scored on latents refitted like the limit-free fit's: a refit alone
        # can lower the windows by more than a change must gain, and is not the limit's doing
        before = objective(refit(p, vel))
        # the config's "none" (a value at the bound would read as pinned there and call the
        # options for a pinned value, `online_structure.PIN_OPTIONS`)
        run.params.set_value(LIMIT, np.full(tuple(p[LIMIT].shape), DEFAULT_MAX_SPEED))
        # the latents were fitted with the limit, so tau is searched again on latents refitted
        # without it, over a narrower line (measured on the rolling twin, tau 0.6x with a 0.3
        # m/s limit: one search on the old latents took 1.46x the truth)
        new_vel, factor = vel, 1.0
        points = int(2 * TAU_OCTAVES * TAU_PER_OCTAVE) + 1     # on each line: the narrow one finer
        for octaves in (TAU_OCTAVES, TAU_OCTAVES / 4):
            tau0 = run.params.value(TAU).detach().clone()
            grid = [float(2.0 ** e) for e in np.linspace(-octaves, octaves, points)]
            best, _ = log_line_search(run, apply, grid, None, refinements=10, loss=lambda: objective(new_vel))
            factor *= best
            new_vel = refit(run.engine.param_values(run.dtype, run.device), new_vel)
        after = objective(new_vel)
        dropped = after < before * (1.0 - run.config.min_rel_improvement)
        run.log(f"speed limit {'dropped' if dropped else 'kept'}: {LIMIT} {float(p[LIMIT].max()):.3g}, windows "
                f"{before:.4e}, without it {after:.4e} ({TAU} x{factor:.3g})")
    except RuntimeError as err:          # a singular latent fit: the test is optional, the epoch is not
        run.log(f"speed limit kept: the test without it failed ({err})")
    finally:
        if not dropped:      # refused, or failed on the way: the values as they were
            set_raw_vector(run.params, run.learn, theta0)
    return (after, new_vel) if dropped else None
