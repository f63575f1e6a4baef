"""How far the data let the cables' force scale move: a profile over the windowed problem.

Multiplying every cable's stiffness and damping by one factor f changes the motion only
through how the cables balance gravity and the rods' inertia; stiff cables on light rods
barely sag, their modes lie far above the 5 Hz that 10 Hz poses resolve, and the pose-only
objective along f is then nearly flat, far beyond the quadratic the Gauss-Newton sigma
assumes. Measured (`bench/online.py --truth zoo/stiff_light`, seed 3, the fifty-sixth
session): refits started at 1 and 1.5 x the published K and c ended 1 % apart in objective
with K at -32 and +1 % of the truth, while the published sigma of K was 8 %.

`profile_cable_scale` holds the learnt cable stiffness and damping at f x the fit's values,
refits every other learnt value and the windows' latents by a few Gauss-Newton steps on a
subset of the solver's windows (every rollout sub-stepped alike, as the top rung needs; the
held values' Jacobian columns not computed), and scores the refit on other windows of the
solver, which it did not use (their latents fitted at the refit's values, the values fixed),
against the same refit at f = 1: a test of "the robot's scale is f", inverted into the
factors the data do not reject (per-window log ratio within `PROFILE_SIGNIFICANCE` standard
errors, as the lag split's check and the structure test judge). Scored on the windows it was
refitted on, a rung's extra freedom fits their noise and the test rejects too little
(measured at the end of the minute, seed 3, the fifty-seventh session: at 1.5 x,
kitchen_sink's in-sample t 0.05 with its K right to 2 %; held out 6.7, and 2.7 at 1.2 x;
stiff_light, the robot at 1.48 x, held out 1.6 at 1.5 x and 3.3 at 2 x). Rungs of
`PROFILE_FACTORS` go out on each side until one is rejected; the reach is interpolated
between the last rung kept and that one (a first rung rejected leaves the curvature's sigma
to hold inside it). The published sigma of the cables' values then reaches the farther
reach (`ScaleProfile.sigma`: per element the larger move of the two sides), every other
learnt value's where the refit moved it. A model keeps its profile until its data doubles,
or for good where both first rungs were rejected by a wide margin (`ScaleProfile.settled`).

Off by default (`IdentificationConfig.scale_profile`): an experiment while its verdicts in
the session are measured (docs/online_identification.md).
"""
from __future__ import annotations

import contextlib
import dataclasses
import math
from typing import Optional

import numpy as np
import torch

from tensegrity_engine.identification.acceptance import log_ratio_gain
from tensegrity_engine.identification.scale import SCALE_GROUP
from tensegrity_engine.identification.solvers.levenberg_marquardt import bounded_step, raw_vector, set_raw_vector
from tensegrity_engine.identification.solvers.windows import WindowLevenbergMarquardt, fit_start_velocities

__all__ = ["ScaleProfile", "profile_cable_scale", "may_widen", "kept_profile", "keep_profile", "element_values",
           "CABLE_FORCES",
           "PROFILE_FACTORS", "PROFILE_SIGNIFICANCE", "PROFILE_TIE", "PROFILE_WINDOWS", "PROFILE_HELD_WINDOWS",
           "PROFILE_ITERATIONS", "PROFILE_HELD_ITERATIONS", "PROFILE_REDRAW", "PROFILE_SETTLED"]

CABLE_FORCES = ("cable_stiffness", "cable_damping")
# the rungs each side (f and 1 / f), nearest first: a side stops at its first rejected rung
PROFILE_FACTORS = (1.5, 2.0)
# a rung the windows fit worse by this many standard errors of the mean per-window log
# ratio is rejected (`lag_split.SPLIT_SIGNIFICANCE`, the structure test's 2)
PROFILE_SIGNIFICANCE = 2.0
# a rung whose held-out windows fit within this mean log ratio of the base's ties it, however
# consistent the difference: a symmetry's rungs predict the same to 1e-7 (the latents' fits'
# last digits), and a paired test of such differences reached t 2.1 (the SUPERball twin
# learning its cables and rods' mass: the forces and the inertia scale together). 1e-4 is far
# below what the mocap's noise makes of any real difference in the values.
PROFILE_TIE = 1e-4
# each rung is refitted on at most this many of the solver's windows (an even subset; a third
# of them where fewer) by this many Gauss-Newton steps (16 windows x 3 steps on stiff_light,
# all 31 columns: 3.1-3.7 s of a core a rung), and scored on at most
# `PROFILE_HELD_WINDOWS` of the others, their latents fitted by `PROFILE_HELD_ITERATIONS`
# steps (12 and 24 windows, all six rungs: 11-19 s of a core at the end of the minute)
PROFILE_WINDOWS = 12
PROFILE_ITERATIONS = 2
PROFILE_HELD_WINDOWS = 24
PROFILE_HELD_ITERATIONS = 3
# A model's profile is made again once its data has grown this many times since
# (`uncertainty.SCRATCH_REDRAW`'s reasoning: the data narrow a profile slowly, and each costs
# a few refits)
PROFILE_REDRAW = 2
# ... unless both first rungs were rejected by this many standard errors: more data fix a
# determined scale more firmly (noisy_mocap's ten profiles, the fifty-eighth session: t 3.3-11.1
# on the first, 6.2-11.1 on twice the data and more, each 7.3-8.6 s of a core for nothing)
PROFILE_SETTLED = 4.0


@dataclasses.dataclass(frozen=True)
class ScaleProfile:
    """The rungs tested, their verdicts and the reach on each side."""
    factors: tuple           # the factors f scored, in the order scored
    t: tuple                 # per factor: standard errors by which its refit fits the held-out windows worse
    reach: tuple             # (lowest, highest) factor the data do not reject (interpolated)
    windows: int             # held-out windows scored
    refit_windows: int = 0   # windows the rungs were refitted on
    # learnt name -> per element |value refitted at the farther reach - value refitted at
    # f = 1| over |the latter|
    moved: dict = dataclasses.field(default_factory=dict)

    @property
    def spread(self) -> float:
        """The larger of highest reach / 1 and 1 / lowest reach: how far the scale may be off."""
        return max(self.reach[1], 1.0 / self.reach[0])

    @property
    def settled(self) -> bool:
        """Both sides' first rungs scored and rejected by `PROFILE_SETTLED` standard errors."""
        sides = [[t for f, t in zip(self.factors, self.t) if (f > 1.0) == up] for up in (False, True)]
        return all(side and side[0] >= PROFILE_SETTLED for side in sides)

    def sigma(self, values: dict) -> dict:
        """Learnt name -> 1-sigma per element at ``values`` (name -> elements) whose twice spans
        the move to the farther reach, relative to the values."""
        return {n: np.asarray(m, dtype=np.float64) * np.abs(np.asarray(values[n], dtype=np.float64)) / 2.0
                for n, m in self.moved.items()}


def may_widen(published: dict, values: dict, factors=PROFILE_FACTORS) -> bool:
    """Whether a profile could widen the ``published`` 1-sigma (name -> per element, before
    any profile) of a cable force at ``values`` (`element_values`): its sigma reaches at most
    half the move to the top rung, so where every element's is already that wide the refits
    would widen only the other learnt values the scale drags along (their sigma is not
    checked here), at the solver's expense (the profile took 23 of stiff_light seed
    3's 52 s of the worker at the bench's budget, the fifty-eighth session, and the solver's
    fit ended 31 mm off 1 s ahead instead of 21)."""
    most = (max(factors, default=1.0) - 1.0) / 2.0
    for n in CABLE_FORCES:
        if n in published and n in values:
            sigma = np.asarray(published[n], dtype=np.float64).reshape(-1)
            if np.any(sigma < most * np.abs(np.asarray(values[n], dtype=np.float64).reshape(-1))):
                return True
    return False


def kept_profile(trainer) -> Optional[ScaleProfile]:
    """The model's last profile (`keep_profile`) while its data has only grown, less than
    `PROFILE_REDRAW` times, since (for ever where it is `settled`); else None. Its reach is
    relative, so it carries over to values that moved since."""
    kept, data = getattr(trainer, "scale_profile", None), trainer.train
    if kept is None or data is None:
        return None
    profile, size, first, starts = kept
    if len(data) < size or (len(data) >= PROFILE_REDRAW * size and not profile.settled) \
            or int(first.max()) >= len(data):
        return None
    return profile if torch.equal(data.x0[first], starts) else None


def keep_profile(trainer, profile: Optional[ScaleProfile], windows: Optional[torch.Tensor]) -> None:
    """Keep ``profile`` (made on the training ``windows``) for the model's next estimates."""
    if profile is None or windows is None:
        trainer.scale_profile = None
        return
    first = windows[:, 0]
    trainer.scale_profile = (profile, len(trainer.train), first, trainer.train.x0[first].clone())


@contextlib.contextmanager
def _learning(trainer, names):
    """Within: ``trainer`` learns only ``names`` (the held values' Jacobian columns are not
    computed: 7 of stiff_light's 31 with a stiffness per cable)."""
    learn = trainer.learn
    trainer.learn = tuple(names)
    try:
        yield
    finally:
        trainer.learn = learn


def _scaled(params, names, scaled, f: float) -> bool:
    """Multiply the learnt ``scaled`` values of ``params`` by ``f`` in place; False (nothing
    changed) where an element would leave its range."""
    new = {}
    for n in scaled:
        spec, v = params.raw_spec(n), params.shared_value(n).detach().double().cpu().numpy() * f
        if not (np.all(v > spec.lower) and np.all(v < spec.upper)):
            return False
        new[n] = v
    for n, v in new.items():
        params.set_value(n, v)
    return True


def _refit(trainer, lm: WindowLevenbergMarquardt, free, iterations: int) -> Optional[dict]:
    """Gauss-Newton on the learnt ``free`` values (the others as ``trainer.params`` holds
    them) and the latents, from the current values; a step that does not lower the windows'
    objective is quartered and tried again. Leaves the best point in ``trainer.params`` and
    returns its information; None where the first is not finite."""
    from tensegrity_engine.identification.uncertainty import gauss_newton_step   # uncertainty imports this module

    params = trainer.params
    with _learning(trainer, free):
        best = lm.information_at(trainer, raw_vector(params, free))
        if best is None:
            return None
        lm.window_vel = best["vel"]
        step = None
        for _ in range(iterations):
            if step is None:
                step = bounded_step(gauss_newton_step(best["H"], best["G"].sum(0))).to(best["theta"])
                if not bool(torch.isfinite(step).all()):
                    break
            info = lm.information_at(trainer, best["theta"] + step)
            if info is not None and info["rss"] < best["rss"]:
                best, step = info, None
                lm.window_vel = best["vel"]
            else:
                step = step / 4.0
        set_raw_vector(params, free, best["theta"])
    return best


def _one_step(trainer, names, scaled, top: float) -> None:
    """Sub-step every rollout of the profile alike, as finely as the fit's values or the top
    rung's need (stiffer cables need more): rungs judged at another step than the base would
    differ by the discretisation on every window alike, which the per-window test counts."""
    objective, params = trainer.objective, trainer.params
    need = objective.step_for(trainer.engine.param_values(trainer.dtype, trainer.device))
    theta = raw_vector(params, names)
    if _scaled(params, names, scaled, top):
        need = max(need, objective.step_for(trainer.engine.param_values(trainer.dtype, trainer.device)))
        set_raw_vector(params, names, theta)
    objective.substeps = need


def _split(count: int, fit: int, held: int) -> Optional[tuple[np.ndarray, np.ndarray]]:
    """(windows to refit on, windows to score on) of ``count``: even subsets, disjoint, at
    least three each; None where there are not enough."""
    fit = min(fit, max(3, count // 3))
    fitted = np.unique(np.linspace(0, count - 1, fit).astype(int))
    rest = np.setdiff1d(np.arange(count), fitted)
    scored = rest[np.unique(np.linspace(0, len(rest) - 1, min(held, len(rest))).astype(int))]
    if len(fitted) < 3 or len(scored) < 3:
        return None
    return fitted, scored


def _held_rss(trainer, windows: torch.Tensor, start: torch.Tensor) -> np.ndarray:
    """Per window of ``windows`` its residual sum of squares under the trainer's values, the
    latents fitted there from ``start`` (the values fixed): how the values predict data
    they were not fitted to."""
    p = trainer.engine.param_values(trainer.dtype, trainer.device)
    vel = fit_start_velocities(trainer.objective, trainer.train, windows, p,
                               iterations=PROFILE_HELD_ITERATIONS, start=start)
    r = trainer.objective.window_residual(trainer.train, windows, vel, p)
    return (r ** 2).sum(-1).double().cpu().numpy()


def _verdict(base: np.ndarray, point: np.ndarray) -> float:
    """Standard errors by which the per-window errors ``point`` are worse than ``base`` (inf:
    worse by the same ratio everywhere, or a window's rollout not finite); 0 within
    `PROFILE_TIE`. ``base`` finite."""
    if not np.all(np.isfinite(point)):
        return math.inf
    ratio = np.log(np.maximum(point, 1e-300) / np.maximum(base, 1e-300))
    if abs(float(ratio.mean())) < PROFILE_TIE:
        return 0.0
    t = log_ratio_gain(base, point)
    return math.inf if math.isnan(t) else t


def element_values(params, names) -> dict:
    """Name -> the values its raw elements hold (a profiled parameter's mean), float64 on
    the host: the shape every per-element sigma has."""
    return {n: params.shared_value(n).detach().double().cpu().numpy().reshape(-1) for n in names}


@torch.no_grad()
def profile_cable_scale(trainer, solver: WindowLevenbergMarquardt, latents: torch.Tensor, theta0: torch.Tensor,
                        factors=PROFILE_FACTORS, max_windows: int = PROFILE_WINDOWS,
                        iterations: int = PROFILE_ITERATIONS,
                        held_windows: int = PROFILE_HELD_WINDOWS) -> Optional[ScaleProfile]:
    """The profile of the cables' force scale at the raw values ``theta0`` of ``trainer.learn``,
    refitted on an even subset of ``solver``'s windows and scored on others (`_split`), their
    ``latents`` fitted at ``theta0``. None without a learnt cable force and another learnt
    value, with fewer than six windows or where the refit at f = 1 is not finite. The
    trainer's values and the solver are left as they were."""
    names = tuple(trainer.learn)
    fixed = [n for n in names if n in CABLE_FORCES]
    free = tuple(n for n in names if n not in CABLE_FORCES)
    split = None if solver.windows is None else _split(len(solver.windows), max_windows, held_windows)
    if not fixed or not free or split is None:
        return None
    params = trainer.params
    pick, held = (torch.as_tensor(i, device=solver.windows.device) for i in split)
    scored_windows, held_start = solver.windows[held], latents[held]
    lm = WindowLevenbergMarquardt(solver.config)
    lm.windows, lm.window_vel = solver.windows[pick], latents[pick].clone()
    lm.latent_cols = solver.latent_cols
    # the rest of the force scale (a learnt mass, the contact's stiffness) moves along
    # (`scale.SCALE_GROUP`: with the mass learnt too the motion is the same, the profile flat)
    scaled = [n for n in names if n in SCALE_GROUP]
    before, substeps = raw_vector(params, names), trainer.objective.substeps
    try:
        set_raw_vector(params, names, theta0)
        _one_step(trainer, names, scaled, max(factors, default=1.0))
        base = _refit(trainer, lm, free, iterations)
        if base is None:
            return None
        base_theta, base_vel = raw_vector(params, names), lm.window_vel.clone()
        base_values = element_values(params, names)
        base_held = _held_rss(trainer, scored_windows, held_start)
        if not np.all(np.isfinite(base_held)):
            return None
        scored, t_of, reach, far = [], [], [1.0, 1.0], {}
        for side, sign in ((0, -1.0), (1, 1.0)):
            # each rung starts from the last one's refit (values and latents): the valley bends
            set_raw_vector(params, names, base_theta)
            lm.window_vel = base_vel.clone()
            last_a, last_t, last_values = 0.0, 0.0, base_values
            for f in factors:
                a = sign * math.log(f)
                if not _scaled(params, names, scaled, math.exp(a - last_a)):
                    break
                point = _refit(trainer, lm, free, iterations)
                if point is None or not math.isfinite(point["rss"]):
                    break
                t = _verdict(base_held, _held_rss(trainer, scored_windows, held_start))
                scored.append(math.exp(a))
                t_of.append(t)
                values = element_values(params, names)
                if t >= PROFILE_SIGNIFICANCE:
                    # rejected: the reach lies between the last rung kept and this one (none
                    # kept: the curvature's sigma holds inside the first rung)
                    if last_a:
                        w = (min(max((PROFILE_SIGNIFICANCE - last_t) / (t - last_t), 0.0), 1.0)
                             if math.isfinite(t) else 0.0)
                        last_values = {n: last_values[n] + w * (values[n] - last_values[n]) for n in names}
                        last_a = last_a + w * (a - last_a)
                    break
                last_a, last_t, last_values = a, max(t, last_t), values
            reach[side] = math.exp(last_a)
            far[side] = {**last_values, **{n: base_values[n] * reach[side] for n in fixed}}
    finally:
        set_raw_vector(params, names, before)
        trainer.objective.substeps = substeps
    # per element the larger move of the two reaches (the published sigma is symmetric)
    moved = {n: np.maximum(*(np.abs(far[side][n] - base_values[n]) for side in (0, 1)))
             / np.maximum(np.abs(base_values[n]), 1e-300) for n in names}
    return ScaleProfile(factors=tuple(scored), t=tuple(t_of), reach=(reach[0], reach[1]),
                        windows=int(len(held)), refit_windows=int(len(pick)), moved=moved)
