"""The force-scale line search: the one direction the recurrent loss barely sees.

Cable and contact forces are linear in (K, c, k_c, c_c), friction scales with the normal
force and gravity with the mass, so multiplying every stiffness, damping and mass by the
same s leaves the motion unchanged: only known external forces (pushes, `wrench`) fix
the absolute scale. Along that valley gradient steps crawl (measured on a zoo 3-bar: K/m
and c/m within 1 % of the truth after the coarse phase, mass 17x too large), so after the
random multi-start and before the fine stage the run tries a log grid of s (on that
stage's loss) and keeps the best.
Without known wrenches the scale is unidentifiable and the search is skipped: the
masses then stay where the user put them (weigh the rods).
"""
from __future__ import annotations

import math

import numpy as np
import torch

SCALE_GROUP = ("cable_stiffness", "cable_damping", "rod_mass", "contact_stiffness", "contact_damping")


def _loss(run, idx) -> float:
    p = run.engine.param_values(run.dtype, run.device)
    loss = float(run.batch_loss(run.train, idx, p))
    return loss if math.isfinite(loss) else math.inf


@torch.no_grad()
def scale_search(run, *, octaves: float = 8.0, per_octave: int = 2, refinements: int = 14,
                 tuples: int = 64) -> float:
    """Multiply the learnt members of `SCALE_GROUP` of ``run`` (a `ProgressiveTrainer`) by the
    best s in [2^-octaves, 2^octaves] on the current stage's loss; returns s (1: no change)."""
    names = [n for n in SCALE_GROUP if n in run.learn]
    if "rod_mass" not in names or len(names) < 2 or run.train.wrenches is None \
            or not bool(run.train.wrenches.abs().max() > 0):
        return 1.0
    rng = np.random.default_rng(run.config.seed + 104729)
    n = len(run.train)
    idx = torch.as_tensor(np.sort(rng.permutation(n)[:min(n, tuples)]), device=run.device)
    start = {k: run.params.value(k).detach().clone() for k in names}
    bounds = {k: run.params.bounds_of(k) for k in names}

    def inside(s: float) -> bool:
        # a margin: a value on the bound has no raw (sigmoid) representation
        return all(bool(((start[k] * s > lo * (1 + 1e-6)) & (start[k] * s < hi * (1 - 1e-6))).all())
                   for k, (lo, hi) in bounds.items())

    def apply(s: float) -> None:
        for k in names:
            run.params.set_value(k, (start[k] * s).cpu().numpy())

    losses = {1.0: _loss(run, idx)}
    for e in np.linspace(-octaves, octaves, int(2 * octaves * per_octave) + 1):
        s = float(2.0 ** e)
        if s != 1.0 and inside(s):
            apply(s)
            losses[s] = _loss(run, idx)
    best = min(losses, key=losses.get)
    # Golden-section search in log s between the best grid point's neighbours.
    grid = sorted(losses)
    i = grid.index(best)
    lo, hi = math.log(grid[max(i - 1, 0)]), math.log(grid[min(i + 1, len(grid) - 1)])
    ratio = (math.sqrt(5.0) - 1.0) / 2.0

    def score(x: float) -> float:
        s = math.exp(x)
        if s not in losses:
            apply(s)
            losses[s] = _loss(run, idx)
        return losses[s]

    a, b = hi - ratio * (hi - lo), lo + ratio * (hi - lo)
    fa, fb = score(a), score(b)
    for _ in range(refinements):
        if fa <= fb:
            hi, b, fb = b, a, fa
            a = hi - ratio * (hi - lo)
            fa = score(a)
        else:
            lo, a, fa = a, b, fb
            b = lo + ratio * (hi - lo)
            fb = score(b)
    best = min(losses, key=losses.get)
    apply(best)
    if best != 1.0:
        run.log(f"force-scale search: x{best:.3g} ({', '.join(names)}), loss {losses[1.0]:.3e} -> "
                f"{losses[best]:.3e}")
    return best
