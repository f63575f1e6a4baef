"""How sure an identification is: 1-sigma per parameter and what the data cannot determine.

Gauss-Newton (Laplace) estimate at the identified values: with J the Jacobian of the tuple
residuals r w.r.t. the raw (logit) values of the learnt parameters,

    cov_raw = s^2 (J^T J)^+,   s^2 = |r|^2 / (n - P)

(the residual variance stands in for the unknown sensor noise and model mismatch), then
each value's 1-sigma by the delta method through its reparameterisation. Directions of
J^T J that the data does not constrain (eigenvalues of the column-scaled matrix below
``singular`` times the largest) are inverted at that floor: a parameter whose variance is
then mostly theirs is *undetermined* (sigma = inf) until the robot moves in a way that
reveals it; the others keep their share of them.

A value pinned against a bound of its range (``at_bound``: within ``AT_BOUND`` of the range
in raw units) is a different verdict: the data asks for a value the model does not allow,
so the model lacks structure the robot has, or the bound is too tight. Its sigma is the
curvature's there, one-sided in truth (measured: a SUPERball whose cable stiffnesses spread
+-20 %, fitted with one shared stiffness, drives the actuator's time constant to its 2 ms
bound, 25 ms true, in either integrator; every time constant up to 17 ms fits within 4 %).
Where that value is a cable's, a rod's or the motors' (`compensating`), every learnt value
makes up for the missing structure, and what the node publishes has no finite sigma.

Residuals of one tuple are correlated and model mismatch is not noise, so sigma is a lower
bound on the real error: trust it to rank parameters and to flag missing excitation.

Mismatch that every stretch of motion shares (a winch limit the model lacks, a contact law
unlike the robot's) moves no group against the others, so neither sigma nor the groups'
spread can see it. It does show as a dependence on the horizon: a model whose structure is
the robot's has the same best values over windows of any length (up to noise), a wrong one
compromises differently over 0.3 s and over 0.6 s. On pose-only data ``sigma_structure``
is how far the values move when the same data is fitted over windows `HORIZON_FACTOR` times
as long (one Gauss-Newton step of each problem from the values: a specification check in
the spirit of Hausman's; it carries the noise of a fit on a subset too, so it is not zero
for a right model on noisy data); each estimate's shift is pooled with the earlier ones of
the same model (`pooled_shift`: the mismatch stays, the noise of one draw does not).
``sigma_step`` is how far one more step of the solver's own problem would move the values.
What the node publishes adds both to the spread.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Optional

import numpy as np
import torch

from tensegrity_engine.identification.config import CONTACT_PARAMS, SOFT_CONTACT_PARAMS
from tensegrity_engine.identification.lag_split import LagSplit, check_lag_split
from tensegrity_engine.identification.solvers.levenberg_marquardt import (bounded_step, jacobian_mode,
                                                                          one_sided_jacobian, raw_vector,
                                                                          residual_jacobian, set_raw_vector,
                                                                          tuple_rows)
from tensegrity_engine.identification.scale import SCALE_GROUP
from tensegrity_engine.identification.solvers.covariance import (MIN_JACKKNIFE_GROUPS, SINGULAR,  # noqa: F401
                                                                element_variance, jackknife_variance)
from tensegrity_engine.identification.solvers.windows import WindowLevenbergMarquardt, inherit_windows, score_groups
from tensegrity_engine.physics.params import SPEC_BY_NAME, PhysicalParameters

# A value whose position in its range (sigmoid of its raw value) is within this of 0 or 1 is
# pinned at a bound: 0.6 % of a range of 500x on a log scale.
AT_BOUND = 1e-3
# `sigma_structure`: the longer windows' length over the solver's (``pose_window``), and at
# most how many of them (a random subset: the shift is 3-10 values from hundreds of residuals)
HORIZON_FACTOR = 2
HORIZON_WINDOWS = 64
# `pooled_shift`: the latest estimates' horizon shifts pooled per trainer
SHIFT_POOL = 16
# A scratch windowed problem (before the solver's windowed stage) is drawn and fitted again
# once the data has grown this many times since (as the solver's `window_refresh`).
SCRATCH_REDRAW = 2
MIN_WARM = 8
# Values whose range is their meaning's (a share, 0-1): at an end they may be the robot's own
# (a robot whose cables damp slack as taut has a share of 1), not beyond what the model allows.
PHYSICAL_RANGE = ("cable_slack_damping",)
# the ground contact's values under either law (`ParameterUncertainty.compensating` leaves them out)
GROUND_CONTACT = frozenset(CONTACT_PARAMS + SOFT_CONTACT_PARAMS)


@dataclasses.dataclass(frozen=True)
class ParameterUncertainty:
    sigma: dict            # learnt name -> 1-sigma per element (value units; inf: undetermined)
    undetermined: tuple    # learnt names the data cannot determine yet
    residual_sigma: float  # s, the residual scale behind sigma
    dof: int               # n - P
    # [P, P] correlation of the learnt elements (order of `labels`, e.g. "cable_stiffness[3]")
    # from the normal matrix (s^2 H^-1; not the cluster-robust variance that may widen sigma);
    # NaN rows for undetermined elements
    correlation: Optional[np.ndarray] = None
    labels: tuple = ()
    # learnt name -> 1-sigma of where a group's own value may lie (random effects: the
    # groups' values scatter about their mean by tau^2 = G x the robust variance's excess over the
    # model's variance, and the mean is uncertain by sigma): how much the answer depends on
    # what the robot happened to do; = sigma when the groups agree; empty without groups
    sigma_spread: dict = dataclasses.field(default_factory=dict)
    # learnt names with an element pinned at a bound of its range (`pinned_at_bound`)
    at_bound: tuple = ()
    # learnt name -> |value fitted over windows HORIZON_FACTOR x as long - value| per element
    # (`horizon_shift`), pooled over the model's estimates (`pooled_shift`): mismatch every
    # group shares; empty where not estimated (data with velocities, no chains long enough, a
    # non-finite longer problem) and no earlier estimate of the model's has one; no new draw
    # while a value is `compensating`
    sigma_structure: dict = dataclasses.field(default_factory=dict)
    # learnt name -> |value after one Gauss-Newton step of the solver's own problem - value|
    # per element: how far the values are from the optimum of their own objective (a solver
    # stopped early, data arrived since); empty where not estimated
    sigma_step: dict = dataclasses.field(default_factory=dict)
    # an orthonormal basis of the unconstrained directions (any rotation of it: equal weak
    # eigenvalues make eigh's choice arbitrary), each {label: component} in the column-scaled
    # raw units where each element's own curvature is 1 (components below 1e-3 left out), and
    # the force-scale direction in the same units (every mass, stiffness and damping learnt
    # times one factor; empty unless a mass and a force are learnt);
    # `identifiability.excitation_advice` says what would determine them
    weak_directions: tuple = ()
    force_scale: dict = dataclasses.field(default_factory=dict)
    # cable_damping and actuator_time_constant -> 1-sigma per element that reaches the mirror
    # split where the training windows cannot tell the two lags apart (`lag_split`); empty
    # where they can, where both are not learnt, or while a value is `compensating` (not
    # checked then); ``lag_split`` the check behind it
    sigma_split: dict = dataclasses.field(default_factory=dict)
    lag_split: Optional[LagSplit] = None
    # learnt limits (``ParamSpec.limit``: a winch's top speed) the data never reach: sigma inf,
    # yet not undetermined; the model predicts these data the same for any value of them
    unreached: tuple = ()
    # learnt name -> the plain 1-sigma per element, s^2 H^-1 alone: what the data say at these
    # values if their residuals were independent noise, before `sigma` widens it for residuals
    # correlated within a window and for mismatch (`data_information` at a robot's true
    # values: what its data determine); inf where undetermined
    sigma_curvature: dict = dataclasses.field(default_factory=dict)

    @staticmethod
    def awaited(names) -> tuple:
        """The learnt ``names`` a convergence test waits for: all but limits
        (``ParamSpec.limit``). A limit's sigma is one-sided: wide where the data barely reach
        it (the SUPERball twin, no winch limit, settles at a top speed of 1.7 m/s that binds
        on a few command jumps, sigma > 5 %, while K, c and tau are within 0.2 %), and the same
        excitation will not reach it more; a limit that binds hard is narrow anyway."""
        return tuple(n for n in names if not SPEC_BY_NAME[n].limit)

    @property
    def compensating(self) -> tuple:
        """Learnt values pinned at a bound (`at_bound`) that make every learnt value a
        compensation: a cable's, rod's or the motors' value, not the ground contact's (its
        bounds include the step's stability limit, and a fit pinned there was measured right
        otherwise: the four-bar's end_heavy robot, K / c / tau +4.3 / -4.0 / -0.0 %), not a
        limit (`ParamSpec.limit`: pinned at its top where the robot has none) nor a share
        (`PHYSICAL_RANGE`). Measured (`bench/online.py`, SUPERball, 9 robots x 5 seeds,
        2026-12-02): such a value was pinned on all 10 runs of the two robots whose structure
        the model lacks (stiff_light's +-20 % cables, kitchen_sink), with K / c / tau up to
        160 / 1270 / 99 % off and the published 2-sigma covering 7-67 % of them; on none of
        the 35 other runs, whose 2-sigma covered 98 %."""
        return tuple(n for n in self.at_bound
                     if n not in GROUND_CONTACT and not SPEC_BY_NAME[n].limit and n not in PHYSICAL_RANGE)

    def published(self) -> dict:
        """Learnt name -> the 1-sigma the node publishes: the spread (sigma where there is
        none), the horizon shift, the solver's remaining step and an undetermined lag split
        (`sigma_split`) added in quadrature; inf for every value while a value is `compensating` (no
        sigma describes a compensation: its error is the missing structure's, not the data's)."""
        base = self.sigma_spread or self.sigma
        if self.compensating:
            return {n: np.full(np.shape(s), np.inf) for n, s in base.items()}
        return {n: np.sqrt(np.square(s) + np.square(self.sigma_structure.get(n, 0.0))
                           + np.square(self.sigma_step.get(n, 0.0)) + np.square(self.sigma_split.get(n, 0.0)))
                for n, s in base.items()}

    def structure_suspect(self) -> tuple:
        """Learnt names whose values move with the horizon by more than twice their spread:
        the model's structure, not the data, sets them (`sigma_structure`)."""
        base = self.sigma_spread or self.sigma
        return tuple(n for n, shift in self.sigma_structure.items()
                     if bool(np.any(np.asarray(shift) > 2.0 * np.asarray(base[n]))))

    def flat(self, params: PhysicalParameters, spread: bool = False, structure: bool = False) -> list[float]:
        """1-sigma aligned with ``params.flat()`` names; NaN for parameters not identified.
        ``spread``: `sigma_spread` where there is one; ``structure`` too: `published` (what
        the node publishes)."""
        source = (self.published() if structure else
                  self.sigma_spread if spread and self.sigma_spread else self.sigma)
        out = []
        for name, v in params.values().items():
            n = v.numel()
            s = source.get(name)
            profile = params.profile(name)
            if s is not None and profile is not None and np.size(s) == 1:     # the mean's sigma, per element
                s = np.asarray(s) * profile.detach().cpu().double().numpy()
            out.extend([math.nan] * n if s is None else np.broadcast_to(s, (n,)).tolist())
        return out

    def mean_sigma(self, name: str, curvature: bool = True) -> float:
        """1-sigma of the mean of ``name``'s elements with their correlation (s^2 H^-1's) taken
        in: of `sigma_curvature` (``curvature``) or `sigma`. What `element_mean_sigma` bounds
        without the correlation (the message carries none)."""
        s = np.asarray((self.sigma_curvature if curvature else self.sigma)[name], dtype=np.float64).reshape(-1)
        if not np.isfinite(s).all():
            return math.inf
        rows = [i for i, lab in enumerate(self.labels) if lab == name or lab.startswith(name + "[")]
        if s.size == 1 or self.correlation is None or len(rows) != s.size:
            return float(s.mean()) if s.size == 1 else element_mean_sigma(s)
        corr = self.correlation[np.ix_(rows, rows)]
        return float(math.sqrt(max(float(s @ corr @ s), 0.0)) / s.size)

    def relative(self, params: PhysicalParameters) -> dict:
        """Learnt name -> largest sigma / |value| over its elements."""
        values = params.as_dict()
        # a shared sigma is the mean's (a profiled parameter's elements scale with it)
        size = {n: np.abs(np.asarray(values[n])).mean() if np.size(s) == 1 else np.abs(np.asarray(values[n]))
                for n, s in self.sigma.items()}
        return {n: float(np.max(s / np.maximum(size[n], 1e-300))) for n, s in self.sigma.items()}


def pinned_at_bound(params: PhysicalParameters, names, fraction: float = AT_BOUND) -> tuple:
    """Learnt ``names`` with an element within ``fraction`` of either end of its range
    (in the reparameterisation's units: where the data pushed it into the bound)."""
    return tuple(name for name in names if bound_sides(params, name, fraction))


def bound_sides(params: PhysicalParameters, name: str, fraction: float = AT_BOUND) -> tuple:
    """The ends of its range ("lower", "upper") that an element of ``name`` is within
    ``fraction`` of (`pinned_at_bound`)."""
    frac = torch.sigmoid(getattr(params, name).detach())
    return tuple(side for side, pinned in (("lower", frac < fraction), ("upper", frac > 1.0 - fraction))
                 if bool(pinned.any()))


def element_mean_sigma(sigma) -> float:
    """1-sigma of the mean of a value's elements (one per cable, rod, ...) whose own 1-sigma
    are ``sigma``, their correlations unknown (the message carries none): the mean of the
    sigmas, what fully correlated errors give and the most any correlation can. Errors that
    make up for a missing structure move together: kitchen_sink's 24 cable stiffnesses, 12 %
    off together over topics, were off by 14 times the sigma independent errors would give
    their mean, and by 2.9 times this one."""
    s = np.asarray(sigma, dtype=np.float64).reshape(-1)
    return float(s.mean()) if s.size else math.nan


def elements_covered(values, truth, sigma, k: float = 2.0) -> Optional[tuple[int, int]]:
    """(elements within ``k`` of their own 1-sigma of their own true value, elements given a
    finite sigma) for a value the model splits per element as the truth does; None where
    either is one shared value or their sizes differ."""
    v, t, s = (np.asarray(x, dtype=np.float64).reshape(-1) for x in (values, truth, sigma))
    if v.size < 2 or not v.size == t.size == s.size:
        return None
    finite = np.isfinite(s)
    return int(np.sum(np.abs(v - t)[finite] <= k * s[finite])), int(finite.sum())


def value_slopes(params: PhysicalParameters, names) -> torch.Tensor:
    """d value / d raw for every raw element of ``names`` (order of `raw_vector`)."""
    out = []
    for name in names:
        spec = params.raw_spec(name)
        frac = torch.sigmoid(getattr(params, name).detach())
        slope = frac * (1.0 - frac)
        if spec.log_scale:
            slope = slope * params.shared_value(name).detach() * (math.log(spec.upper) - math.log(spec.lower))
        else:
            slope = slope * (spec.upper - spec.lower)
        out.append(slope.reshape(-1))
    return torch.cat(out)


def gauss_newton_uncertainty(params: PhysicalParameters, names, J: torch.Tensor, r: torch.Tensor, *,
                             units: int = 0, singular: float = SINGULAR) -> ParameterUncertainty:
    """`ParameterUncertainty` from residuals r [n] and their Jacobian J [n, P] w.r.t. the
    raw elements of ``names`` (in `raw_vector` order) at the current values. ``units`` > 0:
    the residuals are that many equal, consecutive units in time order (tuples), whose
    scores and information feed the cluster jackknife (`score_groups`)."""
    J, r = J.detach().double().cpu(), r.detach().double().cpu()
    n, P = J.shape
    scores = information = None
    if units:
        Ju = J.reshape(units, -1, P)
        scores, information = score_groups((Ju * r.reshape(units, -1, 1)).sum(1), Ju.transpose(1, 2) @ Ju)
    return normal_matrix_uncertainty(params, names, J.T @ J, float(r @ r), max(n - P, 1), scores=scores,
                                     group_information=information, singular=singular)


def normal_matrix_uncertainty(params: PhysicalParameters, names, H: torch.Tensor, rss: float, dof: int, *,
                              scores: Optional[torch.Tensor] = None,
                              group_information: Optional[torch.Tensor] = None,
                              singular: float = SINGULAR) -> ParameterUncertainty:
    """`ParameterUncertainty` from the Gauss-Newton normal matrix H [P, P] (raw elements of
    ``names``), the residual sum of squares and its degrees of freedom. With ``scores``
    [G, P] (each independent group's share of the gradient J'r, e.g. one per
    multiple-shooting window) the variance is the larger of s^2 H^-1 and the
    cluster-robust sandwich H^-1 (sum g g') H^-1 G / (G - 1): residuals correlated within a
    group, or model mismatch that varies between groups, widen it (with more groups than
    values). With ``group_information`` [G, P, P] (each group's share of H) the cluster
    jackknife replaces the sandwich (`jackknife_variance`, from `MIN_JACKKNIFE_GROUPS` groups
    on): a group that dominates H is fitted nearly exactly, so its score is small and the
    sandwich cannot see it (measured online: sigma 0.3 % for a damping 11.9 % off)."""
    P = H.shape[0]
    s2 = rss / max(dof, 1)
    ev = element_variance(H, rss, dof, scores, group_information, singular)
    scale = H.detach().double().cpu().diagonal().clamp(min=0).sqrt() if ev is None else ev.scale
    alive = scale > 0
    var = torch.full((P,), math.inf, dtype=torch.float64)
    plain_var = torch.full((P,), math.inf, dtype=torch.float64)
    corr = torch.full((P, P), math.nan, dtype=torch.float64)
    spread_var = None
    weak_directions = []
    labels = element_labels(params, names)
    if ev is not None:
        lam, V, floor, inv = ev.lam, ev.V, ev.floor, ev.inv
        weak = lam <= floor
        weak_var = (V[:, weak] ** 2 / floor).sum(-1)
        strong_var = (V[:, ~weak] ** 2 / lam[~weak]).sum(-1)
        determined = weak_var <= strong_var
        alive_labels = [lab for lab, a in zip(labels, alive.tolist()) if a]
        for v in V[:, weak].T:
            weak_directions.append({lab: float(c) for lab, c in zip(alive_labels, v.tolist()) if abs(c) > 1e-3})
        model_var, total_var = ev.model, ev.total
        if ev.robust is not None:
            # random effects: the groups' own values scatter by tau^2 = G (robust - model)
            # about their mean, which is itself uncertain by total_var
            spread_var = torch.full((P,), math.inf, dtype=torch.float64)
            spread_var[alive] = torch.where(determined, total_var + ev.groups * (ev.robust - model_var).clamp(min=0),
                                            torch.full_like(model_var, math.inf))
        var[alive] = torch.where(determined, total_var, torch.full_like(total_var, math.inf))
        plain_var[alive] = torch.where(determined, model_var, torch.full_like(model_var, math.inf))
        # correlation of the estimate (scales cancel; the reparameterisation's slopes are
        # positive, so raw and value correlations agree)
        sd = inv.diagonal().sqrt()
        block = inv / (sd[:, None] * sd[None, :])
        idx = alive.nonzero().reshape(-1)
        corr[idx[:, None], idx[None, :]] = block
        corr[var == math.inf] = math.nan
        corr[:, var == math.inf] = math.nan
    # an element the data does not touch at all is a direction of its own (not a limit the
    # data never reach: no excitation of this kind is wanted for it)
    weak_directions += [{lab: 1.0} for lab, a in zip(labels, alive.tolist())
                        if not a and not SPEC_BY_NAME[lab.split("[")[0]].limit]
    slopes = value_slopes(params, names).abs().cpu()
    sigma_value = var.sqrt() * slopes
    plain_value = plain_var.sqrt() * slopes
    spread_value = None if spread_var is None else spread_var.sqrt() * slopes
    sigma, plain, spread, flagged, unreached, i = {}, {}, {}, [], [], 0
    for name in names:
        k = getattr(params, name).numel()
        sigma[name] = sigma_value[i:i + k].numpy().copy()
        plain[name] = plain_value[i:i + k].numpy().copy()
        if spread_value is not None:
            spread[name] = spread_value[i:i + k].numpy().copy()
        if SPEC_BY_NAME[name].limit and not bool(alive[i:i + k].any()):
            unreached.append(name)
        elif bool((var[i:i + k] == math.inf).any()):
            flagged.append(name)
        i += k
    return ParameterUncertainty(sigma=sigma, undetermined=tuple(flagged), residual_sigma=math.sqrt(s2), dof=dof,
                                correlation=corr.numpy(), labels=tuple(labels), sigma_spread=spread,
                                at_bound=pinned_at_bound(params, names), weak_directions=tuple(weak_directions),
                                force_scale=force_scale_direction(params, names, scale), unreached=tuple(unreached),
                                sigma_curvature=plain)


def force_scale_direction(params: PhysicalParameters, names, scale: torch.Tensor) -> dict:
    """{label: component}, unit length: multiplying every learnt mass, stiffness and damping
    (`scale.SCALE_GROUP`) by one factor, in the column-scaled raw units of
    `normal_matrix_uncertainty` (``scale``: the square roots of the normal matrix's diagonal):
    d_i v_i / (d v_i / d raw_i). Empty unless a mass and a force are learnt."""
    group = [n for n in names if n in SCALE_GROUP]
    if "rod_mass" not in group or len(group) < 2:
        return {}
    values = torch.cat([params.shared_value(n).detach().reshape(-1) for n in names]).double().cpu()
    f = scale.double().cpu() * values / value_slopes(params, names).double().cpu()
    in_group = torch.tensor([n in SCALE_GROUP for n in names for _ in range(getattr(params, n).numel())])
    # an element saturated at a bound (slope 0) cannot follow the factor: it holds the scale
    f = torch.where(in_group & torch.isfinite(f), f, torch.zeros_like(f))
    norm = float(f.norm())
    if not norm > 0 or not math.isfinite(norm):
        return {}
    return {lab: float(c) / norm for lab, c in zip(element_labels(params, names), f.tolist()) if abs(c) / norm > 1e-3}


def element_labels(params: PhysicalParameters, names) -> list[str]:
    """A label per raw element of ``names`` (`raw_vector` order): the name, or name[i] for
    a parameter with several elements."""
    out = []
    for name in names:
        k = getattr(params, name).numel()
        out += [name] if k == 1 else [f"{name}[{j}]" for j in range(k)]
    return out


@torch.no_grad()
def trainer_uncertainty(trainer, max_tuples: int = 256, seed: int = 0, at: Optional[dict] = None
                        ) -> ParameterUncertainty:
    """Uncertainty of a `ProgressiveTrainer`'s current values (or of the values ``at``, e.g.
    the best ones, published): pose-only data on the windows of the windowed solver (up to
    ``lm_windows``), data with velocities on at most ``max_tuples`` of its training tuples at
    the step and integrator of the fine stage. The trainer's values are left as they were."""
    data = trainer.train
    if data is None or not trainer.learn:
        raise RuntimeError("no data or nothing learnt: no uncertainty to estimate")
    n = len(data)
    rng = np.random.default_rng(seed)
    idx = torch.as_tensor(np.sort(rng.permutation(n)[:min(n, max_tuples)]), device=trainer.device)
    names = tuple(trainer.learn)
    before = raw_vector(trainer.params, names)
    try:
        for name in names if at is not None else ():
            trainer.params.set_value(name, at[name])
        theta0 = raw_vector(trainer.params, names)
        if trainer.latent:
            return _windowed_uncertainty(trainer, names, theta0, seed)
        return _tuple_uncertainty(trainer, names, theta0, idx)
    finally:
        set_raw_vector(trainer.params, names, before)


def data_information(trainer, at: dict, seed: int = 0) -> ParameterUncertainty:
    """How well a pose-only trainer's training data determine the values ``at`` in its model:
    the windowed problem on *every* window of the data (the solver fits a subset of
    ``lm_windows`` at a time), the latents fitted afresh at ``at`` and eliminated. Where the
    model is the robot and ``at`` its true values, `sigma_curvature` is the Gauss-Newton
    1-sigma these data give under independent residuals: the Cramer-Rao bound for exact
    start poses, and an estimate of it here (each window starts from a measured pose whose
    error its residuals share), against which a solver's error is judged (bench/online.py
    --information). The trainer's values and solver are left as they were."""
    if trainer.train is None or not trainer.learn or not trainer.latent:
        raise RuntimeError("data_information needs a pose-only trainer with data and values to learn")
    names = tuple(trainer.learn)
    before = raw_vector(trainer.params, names)
    try:
        for name in names:
            trainer.params.set_value(name, at[name])
        theta = raw_vector(trainer.params, names)
        lm = WindowLevenbergMarquardt(dataclasses.replace(trainer.config, lm_windows=len(trainer.train)))
        lm.setup(trainer, rng=np.random.default_rng(seed), announce=False, chain=False)
        with trainer.objective.stepped_for(trainer.engine.param_values(trainer.dtype, trainer.device)):
            info = lm.information_at(trainer, theta, refit=True)
    finally:
        set_raw_vector(trainer.params, names, before)
    if info is None:
        raise RuntimeError("the windowed problem has non-finite residuals or Jacobians at these values")
    return normal_matrix_uncertainty(trainer.params, names, info["H"], info["rss"], info["dof"])


def _windowed_uncertainty(trainer, names, theta0, seed: int) -> ParameterUncertainty:
    """Pose-only data: the windowed multiple-shooting problem, latent velocities eliminated,
    whatever stage the schedule is in (tuple residuals rest on finite-difference velocities,
    25-45 % off at 10 Hz: measured sigma 0.0-2 % for values 17-390 % off), linearised at
    the values with fresh latent blocks; before the windowed stage has windows, in a
    scratch solver with its own random stream."""
    lm, refit = trainer.window_lm, False
    if lm.windows is None:
        lm, refit = _scratch_solver(trainer, seed)
    with trainer.objective.stepped_for(trainer.engine.param_values(trainer.dtype, trainer.device)):
        info = lm.information_at(trainer, theta0, refit=refit)
    if info is None:
        raise RuntimeError("the windowed problem has non-finite residuals or Jacobians here")
    if lm is not trainer.window_lm:    # the scratch solver's latents: the horizon shift and the next estimate start there
        lm.window_vel = info["vel"]
        if refit:
            _keep_scratch(trainer, lm)
    u = normal_matrix_uncertainty(trainer.params, names, info["H"], info["rss"], info["dof"], scores=info["G"],
                                  group_information=info["HG"])
    # A value pinned at a bound publishes every sigma as inf (`compensating`): the horizon
    # shift and the lag split's check would change nothing published, and they are most of
    # an estimate's cost (kitchen_sink seed 1's first publication: 4.2 and 6.2 of 13.1 s of
    # the worker's work, with 40 s of the minute left). The model's earlier shifts still pool.
    checked = not u.compensating
    try:
        step = bounded_step(gauss_newton_step(info["H"], info["G"].sum(0)))
        if not bool(torch.isfinite(step).all()):
            raise ValueError("non-finite Gauss-Newton step")
        remaining = _value_changes(trainer, theta0, torch.zeros_like(step), step)
        shift = horizon_shift(trainer, theta0, short_step=step, seed=seed, solver=lm) if checked else {}
    except (RuntimeError, ValueError):        # a failed shift must not cost the sigma
        shift, remaining = {}, {}
    shift = pooled_shift(trainer, shift)
    split, sigma_split = None, {}
    if checked and "cable_damping" in names and "actuator_time_constant" in names:
        values = trainer.params.as_dict()
        try:
            split = check_lag_split(trainer, values, trainer.config.pose_window)
        except (RuntimeError, ValueError):     # a failed check must not cost the sigma
            split = None
        sigma_split = {} if split is None else split.sigma(values)
    return dataclasses.replace(u, sigma_structure=shift, sigma_step=remaining, sigma_split=sigma_split,
                               lag_split=split)


def _scratch_solver(trainer, seed: int) -> tuple[WindowLevenbergMarquardt, bool]:
    """(a windowed problem for a trainer not in its windowed stage yet, whether its latents
    must be fitted from scratch). Once an estimate has fitted them, it is kept
    (``trainer.sigma_scratch``) and the next estimate only polishes them at its own values,
    on the same windows, while the data has only grown and less than doubled
    (`SCRATCH_REDRAW`). Fitted from scratch every time, they were most of an estimate's cost:
    kitchen_sink's per-cable model, adopted in its finite-difference stage, spent 31.7 s of
    the work clock on 73 windows at each publication (its solver's epoch: 3.8 s)."""
    kept, data = getattr(trainer, "sigma_scratch", None), trainer.train
    if kept is not None:
        lm, size, starts = kept
        if size <= len(data) < SCRATCH_REDRAW * size and torch.equal(data.x0[lm.windows[:, 0]], starts):
            return lm, False
    lm = WindowLevenbergMarquardt(trainer.config)
    lm.setup(trainer, rng=np.random.default_rng(seed), announce=False, chain=False)     # fitted by the caller
    return lm, True


def inherit_scratch(trainer, donor) -> bool:
    """Give ``trainer``, not yet in its windowed stage, the windows and fitted latents of
    ``donor``'s windowed stage on the same tuples as its uncertainty's scratch problem
    (`_scratch_solver`), so that its first estimate polishes them instead of fitting every
    window from scratch (a structure challenger adopted before its windowed stage: the
    solver it replaces has fitted those windows; the rods' velocities they hold are the
    robot's, whatever the model). False (nothing given) where the trainer has windows, the
    donor has none, or the tuples differ."""
    own = getattr(trainer, "window_lm", None)
    if own is None or own.windows is not None:
        return False
    scratch = WindowLevenbergMarquardt(trainer.config)
    if not inherit_windows(scratch, trainer, getattr(donor, "window_lm", None), getattr(donor, "train", None)):
        return False
    _keep_scratch(trainer, scratch)
    return True


def _keep_scratch(trainer, lm: WindowLevenbergMarquardt) -> None:
    """Keep ``lm``, fitted, as ``trainer``'s scratch problem, with what `_scratch_solver`
    checks before it reuses it: the data's size and the windows' start poses."""
    trainer.sigma_scratch = (lm, len(trainer.train), trainer.train.x0[lm.windows[:, 0]].clone())


def horizon_shift(trainer, theta0: torch.Tensor, short_step: Optional[torch.Tensor] = None, seed: int = 0,
                  factor: int = HORIZON_FACTOR, warm: bool = True,
                  solver: Optional[WindowLevenbergMarquardt] = None) -> dict:
    """Learnt name -> per raw element |value after one Gauss-Newton step of the windowed
    problem with windows ``factor`` x the solver's length - value after ``short_step``, one
    bounded step of the solver's own problem from ``theta0`` (None: no step)|,
    both from the raw values ``theta0`` of ``trainer.learn``
    (`ParameterUncertainty.sigma_structure`). The short step takes out how far ``theta0``
    is from the solver's own optimum; what is left is the horizon's effect plus the noise of
    a fit on a subset of the data (at most `HORIZON_WINDOWS` windows, chosen at random).
    Windows are shorter than ``factor`` x where the chains are; {} where no chain is longer
    than the solver's windows or that problem is not finite. Each step skips the directions
    its windows do not constrain (`SINGULAR`) and moves each raw value at most
    `bounded_step`'s limit (the solver's trust region). ``warm``: latents from the windows
    of ``solver`` (the trainer's by default; before its windowed stage, the uncertainty's
    scratch solver, its latents just fitted) that start alike (`_warm_start`), else all
    fitted afresh (kitchen_sink's 57 values in the finite-difference stage, one core: a
    shift took 10.0-16.5 s refitted, 4.3-8.1 s warm)."""
    base = int(trainer.config.pose_window)
    # every window first: the pairing with the solver's windows, then the cap (`_warm_start`)
    lm = WindowLevenbergMarquardt(dataclasses.replace(trainer.config, pose_window=factor * base,
                                                      lm_windows=10 ** 9))
    rng = np.random.default_rng(seed + 1)
    try:
        lm.setup(trainer, rng=rng, announce=False, chain=False)     # warm-started below
    except ValueError:                     # isolated tuples only
        return {}
    if lm.windows.shape[1] <= base:
        return {}
    warm = warm and _warm_start(lm, trainer.window_lm if solver is None else solver, rng)
    if not warm:
        keep = _subset(len(lm.windows), HORIZON_WINDOWS, rng, lm.windows.device)
        lm.windows, lm.window_vel = lm.windows[keep], lm.window_vel[keep]
    with trainer.objective.stepped_for(trainer.engine.param_values(trainer.dtype, trainer.device)):
        info = lm.information_at(trainer, theta0, refit=not warm)
    if info is None:
        return {}
    long_step = bounded_step(gauss_newton_step(info["H"], info["G"].sum(0)))
    if short_step is None:
        short_step = torch.zeros_like(long_step)
    if not bool(torch.isfinite(long_step).all()):
        return {}
    return _value_changes(trainer, theta0, short_step, long_step)


def element_values(params, names) -> dict:
    """Name -> the values its raw elements hold (a profiled parameter's mean over its
    elements), float64 on the host: the shape every per-element sigma has."""
    return {n: params.shared_value(n).detach().double().cpu().numpy().reshape(-1) for n in names}


def pooled_shift(trainer, shift: dict) -> dict:
    """Learnt name -> the root mean square of the horizon shifts (`horizon_shift`) of every
    estimate made for this trainer (its model's structure), the latest ``shift`` included, each
    relative to the values it was made at and scaled to the current ones; {} where none was
    made. The mismatch a shift measures is the structure's, which more data does not narrow,
    while each shift is one draw of a noisy fit on a subset of windows: measured on soft_slow
    (the README's sim2sim, K 1.2-1.6 % off in 4 runs of 4), three estimates at the same values
    gave 61, 16 and 22 (the last publication's sigma 22, the error 61), and a last publication
    whose shift was drawn near 0 said 2.6 for a stiffness 68 off (26 sigma). Up to
    `SHIFT_POOL` of the latest are kept (the data the early ones saw is a part of the window)."""
    names = tuple(trainer.learn)
    current = element_values(trainer.params, names)
    history = getattr(trainer, "horizon_shifts", None)
    if history is None:                       # the pool lives on the trainer: one per model
        history = trainer.horizon_shifts = []
    if shift and all(n in shift for n in names):
        history.append({n: np.asarray(shift[n], dtype=np.float64) / np.maximum(np.abs(current[n]), 1e-300)
                        for n in names})
        del history[:-SHIFT_POOL]
    pooled = [h for h in history if all(n in h and np.shape(h[n]) == np.shape(current[n]) for n in names)]
    if not pooled:
        return shift
    return {n: np.sqrt(np.mean([np.square(h[n]) for h in pooled], axis=0)) * np.abs(current[n]) for n in names}


def _value_changes(trainer, theta0: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> dict:
    """Learnt name -> per raw element |value at theta0 + b - value at theta0 + a| (raw
    steps of ``trainer.learn``); the trainer's values are left as they were."""
    names = tuple(trainer.learn)
    params, before = trainer.params, raw_vector(trainer.params, names)
    try:
        values = []
        for step in (a, b):
            set_raw_vector(params, names, theta0 + step.to(theta0))
            values.append(element_values(params, names))
    finally:
        set_raw_vector(params, names, before)
    return {n: np.abs(values[1][n] - values[0][n]) for n in names}


def _subset(n: int, most: int, rng: np.random.Generator, device) -> torch.Tensor:
    """Sorted indices of at most ``most`` of ``n`` items, at random."""
    return torch.as_tensor(np.sort(rng.permutation(n)[:most]), device=device)


def _warm_start(lm: WindowLevenbergMarquardt, solver: WindowLevenbergMarquardt, rng: np.random.Generator,
                most: Optional[int] = None) -> bool:
    """Keep the longer windows ``lm`` that start where one of the ``solver``'s windows does,
    at most ``most`` of them, with that window's fitted latents (then polished, not fitted
    from finite differences: 2.4x cheaper; measured 2.0 of a 2.8 s estimate on the twin
    rolling before, 0.8 of 1.6 s after). The solver is only read. False (``lm``
    unchanged) where fewer than `MIN_WARM` match."""
    if solver is None or solver.windows is None or solver.window_vel is None:
        return False
    most = HORIZON_WINDOWS if most is None else most      # read when called: a setting takes effect
    first = {int(w): i for i, w in enumerate(solver.windows[:, 0].tolist())}
    pairs = [(j, first[w]) for j, w in enumerate(lm.windows[:, 0].tolist()) if w in first]
    if len(pairs) < MIN_WARM:
        return False
    pairs = [pairs[k] for k in _subset(len(pairs), most, rng, "cpu").tolist()]
    mine, theirs = (torch.as_tensor(x, device=lm.windows.device) for x in zip(*pairs))
    lm.windows, lm.window_vel = lm.windows[mine], solver.window_vel[theirs].clone()
    return True


def gauss_newton_step(H: torch.Tensor, g: torch.Tensor, singular: float = SINGULAR) -> torch.Tensor:
    """-H^+ g over the directions of the column-scaled H above ``singular`` x its largest
    eigenvalue (zero along the others and for all-zero columns)."""
    H, g = H.detach().double().cpu(), g.detach().double().cpu()
    scale = H.diagonal().clamp(min=0).sqrt()
    alive = scale > 0
    step = torch.zeros_like(g)
    if not bool(alive.any()):
        return step
    d = scale[alive]
    lam, V = torch.linalg.eigh(H[alive][:, alive] / (d[:, None] * d[None, :]))
    keep = lam > singular * float(lam.max().clamp(min=1e-300))
    gs = g[alive] / d
    step[alive] = -(V[:, keep] @ ((V[:, keep].T @ gs) / lam[keep])) / d
    return step


def _tuple_uncertainty(trainer, names, theta0, idx) -> ParameterUncertainty:
    """Data with velocities: the tuple residuals at the fine stage's step and integrator,
    scores per tuple in groups of consecutive tuples."""
    data, n_steps, integrator = trainer.train, trainer.full_steps, trainer.config.fine_integrator

    of_values = tuple_rows(trainer.objective, data, idx, n_steps, integrator)

    def rows(theta, sub):
        set_raw_vector(trainer.params, names, theta)
        return of_values(trainer.engine.param_values(trainer.dtype, trainer.device), sub)

    def residual(theta):
        set_raw_vector(trainer.params, names, theta)
        p = trainer.engine.param_values(trainer.dtype, trainer.device)
        return trainer.objective.residuals(data, idx, p, n_steps, integrator)

    with trainer.objective.stepped_for(trainer.engine.param_values(trainer.dtype, trainer.device)):
        r = residual(theta0)
        J = (one_sided_jacobian(residual, theta0, r, units=len(idx), units_residual=rows)   # the soft law's jumps
             if jacobian_mode(trainer.config, trainer.objective) == "one_sided" else residual_jacobian(residual, theta0))
        set_raw_vector(trainer.params, names, theta0)
    return gauss_newton_uncertainty(trainer.params, names, J, r, units=len(idx))      # idx: in time order
