"""The force-scale line search: the one direction the recurrent loss barely sees.

Cable and contact forces are linear in (K, c, k_c, c_c), friction scales with the normal
force and gravity with the mass, so multiplying every stiffness, damping and mass by the
same s leaves the motion unchanged: only known external forces (pushes, `wrench`) fix
the absolute scale. Along that valley gradient steps crawl (measured on a zoo 3-bar: K/m
and c/m within 1 % of the truth after the coarse phase, mass 17x too large), so after the
random multi-start and before the fine stage the run tries a log grid of s (on that
stage's loss) and keeps the best. The same log line search finds a winch speed limit,
which has no gradient while it does not bind.
Without known wrenches the scale is unidentifiable and the search is skipped: the
masses then stay where the user put them (weigh the rods).
"""
from __future__ import annotations

import math

import numpy as np
import torch

SCALE_GROUP = ("cable_stiffness", "cable_damping", "rod_mass", "contact_stiffness", "contact_damping")


@torch.no_grad()
def _loss(run, idx) -> float:
    p = run.engine.param_values(run.dtype, run.device)
    loss = float(run.batch_loss(run.train, idx, p))
    return loss if math.isfinite(loss) else math.inf


def _tuples(run, tuples: int, salt: int) -> torch.Tensor:
    rng = np.random.default_rng(run.config.seed + salt)
    n = len(run.train)
    return torch.as_tensor(np.sort(rng.permutation(n)[:min(n, tuples)]), device=run.device)


def log_line_search(run, apply, factors, idx, refinements: int = 14, loss=None) -> tuple[float, dict]:
    """Best factor s for ``apply(s)`` on the current stage's loss of tuples ``idx`` (or on
    ``loss()``): the given grid (1 = no change, always scored), then golden-section search
    in log s between the best grid point's neighbours. Applies and returns it, with every
    loss scored."""
    losses = {}

    def score(s: float) -> float:
        if s not in losses:
            apply(s)
            value = _loss(run, idx) if loss is None else loss()
            losses[s] = value if math.isfinite(value) else math.inf
        return losses[s]

    for s in sorted(set(factors) | {1.0}):
        score(float(s))
    best = min(losses, key=losses.get)
    grid = sorted(losses)
    i = grid.index(best)
    lo, hi = math.log(grid[max(i - 1, 0)]), math.log(grid[min(i + 1, len(grid) - 1)])
    ratio = (math.sqrt(5.0) - 1.0) / 2.0
    a, b = hi - ratio * (hi - lo), lo + ratio * (hi - lo)
    fa, fb = score(math.exp(a)), score(math.exp(b))
    for _ in range(refinements):
        if fa <= fb:
            hi, b, fb = b, a, fa
            a = hi - ratio * (hi - lo)
            fa = score(math.exp(a))
        else:
            lo, a, fa = a, b, fb
            b = lo + ratio * (hi - lo)
            fb = score(math.exp(b))
    best = min(losses, key=losses.get)
    apply(best)
    return best, losses


@torch.no_grad()
def scale_search(run, *, octaves: float = 8.0, per_octave: int = 2, refinements: int = 14,
                 tuples: int = 64) -> float:
    """Multiply the learnt members of `SCALE_GROUP` of ``run`` (a `ProgressiveTrainer`) by the
    best s in [2^-octaves, 2^octaves] on the current stage's loss; returns s (1: no change)."""
    names = [n for n in SCALE_GROUP if n in run.learn]
    if "rod_mass" not in names or len(names) < 2 or run.train.wrenches is None \
            or not bool(run.train.wrenches.abs().max() > 0):
        return 1.0
    idx = _tuples(run, tuples, 104729)
    start = {k: run.params.value(k).detach().clone() for k in names}
    bounds = {k: run.params.bounds_of(k) for k in names}

    def inside(s: float) -> bool:
        # a margin: a value on the bound has no raw (sigmoid) representation
        return all(bool(((start[k] * s > lo * (1 + 1e-6)) & (start[k] * s < hi * (1 - 1e-6))).all())
                   for k, (lo, hi) in bounds.items())

    def apply(s: float) -> None:
        for k in names:
            run.params.set_value(k, (start[k] * s).cpu().numpy())

    grid = [float(2.0 ** e) for e in np.linspace(-octaves, octaves, int(2 * octaves * per_octave) + 1)]
    best, losses = log_line_search(run, apply, [s for s in grid if inside(s)], idx, refinements)
    if best != 1.0:
        run.log(f"force-scale search: x{best:.3g} ({', '.join(names)}), loss {losses[1.0]:.3e} -> "
                f"{losses[best]:.3e}")
    return best


@torch.no_grad()
def speed_limit_search(run, *, octaves: float = 10.0, per_octave: int = 2, tuples: int = 64) -> float:
    """A winch speed limit that does not bind has no gradient (a flat loss), so no local
    step finds one: when ``actuator_max_speed`` is learnt and does not bind, try limits from
    the fastest the filter ever runs (command span / tau) down ``octaves`` octaves and keep
    the best on the current stage's loss. Returns the factor on the old value (1: kept).
    It runs at the values of the moment: slow motors can pass for a limit at the config's
    tau, so a limit taken here must pay for itself again where the windowed stage settles
    (`solvers.limit_drop`)."""
    from tensegrity_engine.physics.actuators import speed_limit_binds

    name = "actuator_max_speed"
    if name not in run.learn:
        return 1.0
    p = run.engine.param_values(run.dtype, run.device)
    tau, speed = p["actuator_time_constant"], p[name]
    span = run.objective.cmd_high - run.objective.cmd_low
    if speed_limit_binds(tau, speed, span):
        return 1.0
    idx = _tuples(run, tuples, 7919)
    start = speed.detach().clone()
    fastest = float((span.max() / tau).max())
    lo, hi = run.params.bounds_of(name)

    def apply(s: float) -> None:
        run.params.set_value(name, (start * s).cpu().numpy())

    grid = [fastest * 2.0 ** -e / float(start.max()) for e in np.arange(0.0, octaves + 1e-9, 1.0 / per_octave)]
    grid = [s for s in grid if lo * (1 + 1e-6) < float(start.max()) * s < hi * (1 - 1e-6)]
    best, losses = log_line_search(run, apply, grid, idx)
    # a limit that barely binds fits noise: the loss falls by what the CPU's round-off or one
    # tuple decides (measured on a test's data: 3.529e-3 either way, the limit left at 1e3 on
    # an Intel Xeon, set to 8.7 m/s on an AMD EPYC); it must gain what the solver calls progress
    if best != 1.0 and not losses[best] < losses[1.0] * (1.0 - run.config.min_rel_improvement):
        apply(1.0)
        best = 1.0
    if best != 1.0:
        run.log(f"speed-limit search: {name} {float(start.max() * best):.3g}, loss {losses[1.0]:.3e} -> "
                f"{losses[best]:.3e}")
    return best
