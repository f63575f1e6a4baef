"""The windowed solver's line search along the cables' force scale.

With the rods weighed, poses fix the scale of the cable forces only against gravity and the
rods' inertia, and on a stiff, heavily damped robot that is a shallow valley: the lags (c/k,
tau) are sharp, while the cables' stiffness and damping moved together by the same factor
change the objective little. Levenberg-Marquardt crawls along it. Measured (SUPERball zoo,
`bench/online.py --per-element cable_stiffness`, 60 s, the fiftieth session): kitchen_sink's
fits ended 20-25 % high in K and c together on 3 of 5 seeds with the robot's own values
fitting the training windows better on all five, none converged; stiff_light without mocap
noise ended 38 % low (objective 0.00576 against the truth's 0.00285), 23 % low at 4x the
compute. So every ``force_scale_every`` iterations the two are scored together on a log
grid of factors around the current values, each with the windows' latent velocities
polished at it (`WindowLevenbergMarquardt._polish_latents`: one batched rollout a sweep),
and the best is taken where it lowers the objective by what the solver counts as progress
(``min_rel_improvement``). As the offline force-scale search (`scale.scale_search`, which
moves the masses too where known pushes fix the absolute scale).
"""
from __future__ import annotations

import math

import torch

from tensegrity_engine.identification.scale import log_line_search
from tensegrity_engine.identification.solvers.levenberg_marquardt import raw_vector, set_raw_vector

SCALED = ("cable_stiffness", "cable_damping")
FACTORS = (0.7, 0.84, 1.19, 1.43)      # about +-1/2 octave: further than the crawl goes in several iterations
REFINEMENTS = 3                        # golden-section steps between the best grid point's neighbours


@torch.no_grad()
def force_scale_search(run, loss) -> tuple[float, float, float]:
    """Scale the learnt cable stiffness and damping of ``run`` together by the best factor on
    ``loss()`` (the windowed objective at the values as set, latents polished there), kept only
    where it lowers the objective by ``min_rel_improvement``; the values are left as found
    otherwise. Returns (factor taken, 1 for none; the objective before; after)."""
    names = [n for n in SCALED if n in run.learn]
    if len(names) < len(SCALED):
        return 1.0, math.nan, math.nan
    theta0 = raw_vector(run.params, run.learn)
    start = {n: run.params.value(n).detach().clone() for n in names}
    bounds = {n: run.params.bounds_of(n) for n in names}

    def inside(s: float) -> bool:          # a value on its bound has no raw (logit) representation
        return all(bool(((start[n] * s > lo * (1 + 1e-6)) & (start[n] * s < hi * (1 - 1e-6))).all())
                   for n, (lo, hi) in bounds.items())

    applied = [1.0]

    def apply(s: float) -> None:
        applied[0] = s
        if inside(s):          # outside: scored as infinite (the golden section may step out)
            for n in names:
                run.params.set_value(n, (start[n] * s).cpu().numpy())

    grid = [s for s in FACTORS if inside(s)]
    if not grid:
        return 1.0, math.nan, math.nan
    best, losses = log_line_search(run, apply, grid, None, refinements=REFINEMENTS,
                                   loss=lambda: loss() if inside(applied[0]) else math.inf)
    before, after = losses[1.0], losses[best]
    if not (best != 1.0 and inside(best) and after < before * (1.0 - run.config.min_rel_improvement)):
        set_raw_vector(run.params, run.learn, theta0)
        return 1.0, before, before
    run.log(f"force-scale search: {', '.join(names)} x{best:.3g}, windows {before:.4e} -> {after:.4e}")
    return best, before, after


__all__ = ["force_scale_search", "SCALED", "FACTORS", "REFINEMENTS"]
