"""Model-structure selection: which of the engine's structural options the robot's data asks for.

Fitting values into the wrong structure biases them (a robot whose winches are rate-limited
gets a slow time constant and extra damping; one simulated with implicit damping gets too
little damping) and predicts worse than the structure could. Each option below adds a way
for the model to be *built*, not a new value of the same model:

================  =====================================================================
option            what it adds
================  =====================================================================
implicitfast      the step: cable damping and gyroscopic terms implicit per rod
                  (MuJoCo's ``implicitfast``), instead of the semi-implicit step
rk4               the step: four Runge-Kutta stages (MuJoCo's ``RK4``); one step option
                  at most
slack_damping     a share of the cable damping that also acts on slack cables (a tendon
                  damper): learns ``cable_slack_damping``
end_heavy         rod inertia other than a uniform rod's: ``rod_inertia_factor``
winch_speed       a top winch speed: ``actuator_max_speed``
per_cable         stiffness and damping per cable instead of one value
per_rod_mass      a mass per rod (a payload) instead of one value
================  =====================================================================

`select_structure` runs forward selection on held-out data: starting from the base model
(the robot's own structure, core values fitted), every round fits each remaining option on
top of the current structure, each fit from the same start (the config's values: a fit
warm-started from the current structure inherits its compensations, e.g. a slow time
constant standing in for a winch speed limit, and Levenberg-Marquardt does not leave
them), and keeps the one that predicts the
held-out trajectories best ``horizon`` ahead, if it beats the current structure by at least
``min_gain`` (relative), by at least ``min_base_share`` of the base model's error and
``min_path_share`` of the distance the robot moves in ``horizon`` (absolute), *and* by
more than ``sigmas`` standard errors of the paired per-window
log ratio of the errors; it stops when no option does. The absolute floor is there because two fits of
the same structure differ too (Levenberg-Marquardt on random tuple subsets): on the zoo's
``soft_slow`` (3-bar, hanging), options the robot does not have (a winch speed limit, a
mass per rod) gained 0.08 mm on a 0.55 mm model, 14 % and 4.5 standard errors, but 1.6 % of
the base model's 5.1 mm; on a twin-like robot whose base model is already within 0.2 mm, a
refit with slack damping gained 0.08 mm, a quarter of a thousandth of the 0.34 m it moves
in a second. More parameters must pay for
themselves on data they were not fitted on; an unstable candidate (any window diverging)
never wins.

`select_contact_law` then fits the contact values on rolling data under each ground contact
law, alone and with each of `CONTACT_OPTIONS` that selection left out (its caller says which
it chose; a mass per rod, slack-cable damping: options whose evidence is mostly in contact
data), and keeps another law by the paired verdict, an option by the verdict and the floor;
under the soft law it then tries the other contact dimensionalities (MuJoCo's condim 3, 4,
6) with what it kept.
"""
from __future__ import annotations

import dataclasses
import math
import time
from typing import Callable, Optional, Sequence

import numpy as np

from tensegrity_engine.identification.acceptance import log_ratio_gain, with_estimated_velocity
from tensegrity_engine.identification.config import IdentificationConfig, contact_params
from tensegrity_engine.identification.dataset import Trajectory, tuples_from
from tensegrity_engine.identification.evaluation import horizon_errors
from tensegrity_engine.identification.trainer import ProgressiveTrainer
from tensegrity_engine.physics.config import RobotConfig
from tensegrity_engine.physics.params import PhysicalParameters

__all__ = ["StructureOption", "OPTIONS", "BASE_LEARN", "SCREEN_PATIENCE", "Candidate", "StructureSelection", "select_structure",
           "structure_options", "structure_config", "with_contact_law", "select_contact_law", "CONTACT_OPTIONS",
           "contact_fit_config",
           "SOFT_CONDIMS",
           "contact_options", "refit_noncontact"]

# Values every structure fits (the robot's core physics without contact).
BASE_LEARN = ("cable_stiffness", "cable_damping", "rod_mass", "actuator_time_constant", "actuator_gain",
              "actuator_offset")


@dataclasses.dataclass(frozen=True)
class StructureOption:
    learn: tuple = ()            # parameters the option adds
    per_element: tuple = ()      # parameters it splits per cable / rod
    integrator: Optional[str] = None


OPTIONS = {
    "implicitfast": StructureOption(integrator="implicitfast"),
    "rk4": StructureOption(integrator="rk4"),
    "slack_damping": StructureOption(learn=("cable_slack_damping",)),
    "end_heavy": StructureOption(learn=("rod_inertia_factor",)),
    "winch_speed": StructureOption(learn=("actuator_max_speed",)),
    "per_cable": StructureOption(per_element=("cable_stiffness", "cable_damping")),
    "per_rod_mass": StructureOption(per_element=("rod_mass",)),
}


def structure_options(robot: RobotConfig, fixed_rods: Sequence[int] = ()) -> tuple[str, ...]:
    """The options that can change this robot model: not the integrator it already has, no
    per-rod mass with a single free rod, no per-cable values with one cable."""
    free_rods = robot.num_rods - len(set(fixed_rods))
    names = []
    for name, option in OPTIONS.items():
        if option.integrator is not None and option.integrator == robot.integrator:
            continue
        if "rod_mass" in option.per_element and free_rods < 2:
            continue
        if option.per_element and option.per_element[0].startswith("cable") and robot.num_cables < 2:
            continue
        names.append(name)
    return tuple(names)


@dataclasses.dataclass(frozen=True)
class Candidate:
    options: tuple[str, ...]          # the structure: the base plus these options
    params: PhysicalParameters
    errors: np.ndarray                # held-out CoM error per window at the horizon (m)
    wall: float                       # s, the fit

    @property
    def error(self) -> float:
        return float(np.mean(self.errors))

    @property
    def label(self) -> str:
        return "+".join(self.options) or "base"


@dataclasses.dataclass
class StructureSelection:
    chosen: Candidate
    base: Candidate
    tried: list                       # [(round, Candidate, verdict str)]
    horizon: float

    @property
    def params(self) -> PhysicalParameters:
        return self.chosen.params

    def lines(self) -> list[str]:
        out = [f"structure selection on held-out data, CoM error {self.horizon:g} s ahead:",
               f"  base ({self.base.params.robot.integrator}): {1e3 * self.base.error:.2f} mm"]
        for rnd, cand, verdict in self.tried:
            out.append(f"  round {rnd}: {cand.label:40s} {1e3 * cand.error:8.2f} mm  {verdict}  ({cand.wall:.0f} s)")
        out.append(f"  chosen: {self.chosen.label} ({1e3 * self.chosen.error:.2f} mm)")
        return out


def structure_config(names: Sequence[str], robot: RobotConfig, base_learn: Sequence[str] = BASE_LEARN
                     ) -> tuple[tuple, tuple, str]:
    """(learn, per_element, integrator) of the structure ``base_learn`` plus options ``names``."""
    learn, per_element, integrator = list(base_learn), [], robot.integrator
    for name in names:
        option = OPTIONS[name]
        learn += [n for n in option.learn if n not in learn]
        per_element += [n for n in option.per_element if n not in per_element]
        integrator = option.integrator or integrator
    return tuple(learn), tuple(per_element), integrator


# Candidate fits stop after this many non-improving Levenberg-Marquardt iterations, not the
# default 4: a candidate's held-out error settles before its training loss stops creeping
# (measured on the zoo's stiff_light, implicitfast + per-cable values: 1 s ahead 18.6, 6.0,
# 4.95, 4.99, 4.96 mm after iterations 1-5, then four more iterations within 4.9-5.3 mm).
SCREEN_PATIENCE = 2


def _screening(config: IdentificationConfig, patience: Optional[int]) -> IdentificationConfig:
    """``config`` with the candidates' Levenberg-Marquardt patience (None: unchanged)."""
    if patience is None:
        return config
    return dataclasses.replace(config, lm_patience=min(int(patience), config.lm_patience))


def _fitted_candidate(options: tuple, robot: RobotConfig, start: PhysicalParameters, config: IdentificationConfig,
                      data: tuple, heldout: Sequence[Trajectory], horizon: float, stride: float) -> Candidate:
    """The `Candidate` of ``options``: ``robot`` fitted from ``start`` on ``data`` (training
    tuples, optionally validation tuples) and judged ``horizon`` ahead on ``heldout``."""
    t0 = time.perf_counter()
    trainer = ProgressiveTrainer(robot, config, initial=start)
    trainer.set_data(*data)
    trainer.run()
    params = trainer.parameters
    errors = horizon_errors(params, heldout, (horizon,), stride=stride)[horizon]
    return Candidate(options, params, np.asarray(errors, dtype=np.float64), time.perf_counter() - t0)


def _paired_verdict(cand: np.ndarray, best: np.ndarray, min_gain: float, sigmas: float,
                    min_abs: float = 0.0) -> tuple[bool, str]:
    if not np.all(np.isfinite(cand)):
        return False, "unstable"
    if not np.all(np.isfinite(best)):
        return True, "stable where the current structure diverges"
    diff = best - cand                                        # > 0: the candidate is better
    gain = float(diff.mean() / max(best.mean(), 1e-12))
    if gain < min_gain:
        return False, f"gain {100 * gain:+.1f} % < {100 * min_gain:.0f} %"
    if diff.mean() < min_abs:
        return False, f"gain {1e3 * diff.mean():.2f} mm < {1e3 * min_abs:.2f} mm (base error and motion share)"
    # Significance on the log ratio per window (measured: a soft contact fit at 0.86 against
    # 10.17 mm, better on the windows, was "within 2 standard errors" of the differences
    # over 18 windows)
    z = log_ratio_gain(cand, best)
    if not z > sigmas:
        return False, f"gain {100 * gain:+.1f} % within {sigmas:g} standard errors (log ratio per window)"
    return True, f"gain {100 * gain:+.1f} % ({z:.1f} standard errors of the log ratio)"


def _gain_floor(base: Candidate, heldout: Sequence[Trajectory], horizon: float, min_base_share: float,
                min_path_share: float) -> float:
    """The absolute gain an added option must bring: ``min_base_share`` of the base model's
    error, and ``min_path_share`` of how far the robot moves in ``horizon`` (a gain below a
    thousandth of it is no reason to give the model more structure)."""
    path = float(np.mean([t.path_length() / max(t.t[-1] - t.t[0], 1e-9) for t in heldout])) * horizon
    return max(min_base_share * base.error if np.isfinite(base.error) else 0.0, min_path_share * path)


def select_structure(robot: RobotConfig, train: Sequence[Trajectory], heldout: Sequence[Trajectory],
                     config: IdentificationConfig, *, options: Optional[Sequence[str]] = None,
                     horizon: float = 1.0, stride: float = 0.5, min_gain: float = 0.05, sigmas: float = 2.0,
                     min_base_share: float = 0.02, min_path_share: float = 1e-3,
                     max_rounds: Optional[int] = None, initial: Optional[PhysicalParameters] = None,
                     screen_patience: Optional[int] = SCREEN_PATIENCE,
                     log: Callable[[str], None] = lambda m: None) -> StructureSelection:
    """Forward structure selection (module docstring) from ``train`` trajectories, judged on
    ``heldout`` ones (never fitted). ``config`` sets the budget and solver of every fit (its
    ``learn``, ``per_element`` and ``fine_integrator`` are the structure's and replaced);
    ``initial`` is where the base fit starts (default: the robot's values). The base fits
    ``config.learn`` when given, else `BASE_LEARN`. Held-out trajectories without
    velocities get them from their poses (`acceptance.with_estimated_velocity`).
    ``screen_patience``: the candidates' Levenberg-Marquardt stops after this many
    non-improving iterations (`SCREEN_PATIENCE`; None: ``config.lm_patience``)."""
    unknown = set(options or ()) - set(OPTIONS)
    if unknown:
        raise ValueError(f"unknown structure options {sorted(unknown)}; known: {sorted(OPTIONS)}")
    if not train or not heldout:
        raise ValueError("select_structure needs training and held-out trajectories")
    names = tuple(options) if options is not None else structure_options(robot, heldout[0].fixed_rods)
    train_tuples = tuples_from(list(train), config.period)
    heldout = [with_estimated_velocity(t) for t in heldout]
    base_learn = tuple(config.learn) if config.learn else BASE_LEARN

    start = initial if initial is not None else PhysicalParameters(robot)
    config = _screening(config, screen_patience)

    def fit(chosen: tuple) -> Candidate:
        learn, per_element, integrator = structure_config(chosen, robot, base_learn)
        cfg = dataclasses.replace(config, learn=learn, per_element=per_element, fine_integrator=integrator,
                                  init="given")
        return _fitted_candidate(tuple(chosen), robot, start, cfg, (train_tuples,), heldout, horizon, stride)

    best = base = fit(())
    floor = _gain_floor(base, heldout, horizon, min_base_share, min_path_share)
    log(f"structure base ({robot.integrator}): {1e3 * base.error:.2f} mm {horizon:g} s ahead")
    tried, remaining, rnd = [], list(names), 0
    while remaining and (max_rounds is None or rnd < max_rounds):
        rnd += 1
        round_best, round_verdict = None, ""
        for name in remaining:
            cand = fit(best.options + (name,))
            ok, verdict = _paired_verdict(cand.errors, best.errors, min_gain, sigmas, floor)
            tried.append((rnd, cand, verdict))
            log(f"structure round {rnd}: {cand.label}: {1e3 * cand.error:.2f} mm ({verdict})")
            if ok and (round_best is None or cand.error < round_best.error):
                round_best, round_verdict = cand, verdict
        if round_best is None:
            break
        best = round_best
        remaining.remove(best.options[-1])
        if OPTIONS[best.options[-1]].integrator:          # one step: the other integrators are out
            remaining = [n for n in remaining if not OPTIONS[n].integrator]
        log(f"structure round {rnd}: keeps {best.options[-1]} ({round_verdict})")
    return StructureSelection(chosen=best, base=base, tried=tried, horizon=horizon)


def with_contact_law(params: PhysicalParameters, law: str, condim: Optional[int] = None) -> PhysicalParameters:
    """``params`` (every value and the per-element split kept: the soft law's solref
    values are ``params``' own, the robot's unless set) on its robot with the ground
    contact ``law`` and, when given, the soft law's contact dimensionality ``condim``
    (MuJoCo's: 3 sliding friction, 4 also torsional, 6 also rolling; None keeps the robot's)."""
    robot = params.robot
    contact = robot.contact
    if contact.law == law and (condim is None or contact.soft_condim == condim):
        return params
    changes = {"law": law} | ({"condim": int(condim)} if condim is not None else {})
    robot = robot.replace(contact=dataclasses.replace(contact, **changes))
    return PhysicalParameters(robot, values=params.as_dict(), per_element=params.per_element)


def _contact_structure(robot: RobotConfig) -> tuple:
    """What of a robot's ground contact acts on its dynamics besides values: the law and,
    under the soft law, the contact dimensionality."""
    return (robot.contact.law, robot.contact.soft_condim if robot.contact.law == "soft" else None)


# Structure options that contact data may reveal where the non-contact data could not. The
# rod hung from the fixed points carries none of its mass into hanging data, so a payload on
# it shows only rolling (measured on the zoo's three-bar `payload`, its 80 % payload on the
# hung rod: the soft law with the true values and one mean mass 28.3 mm off 1 s ahead,
# with the true mass per rod 1.1 mm; the chaos floor is 27.8 mm). Cables go slack mostly on
# impacts (measured on `soft_slow`, whose damping also acts on slack cables: hanging
# selection left the option out by 0.17 mm, under its 0.39 mm floor, and the model predicted
# rolling 1 s ahead 5.9 mm off, where a run that kept it was 1.1 mm off).
CONTACT_OPTIONS = ("per_rod_mass", "slack_damping")

# The soft law's contact dimensionalities (MuJoCo's condim) selection tries: the engine's
# default for a config with torsional or rolling friction is 6, and a robot on condim 4
# rolls differently (measured on the zoo's ``noisy_mocap``, condim-4 MuJoCo contacts: its
# true values under condim 6 are 0.11 mm off 0.1 s ahead and 0.85 mm 1 s ahead, under
# condim 4 0.001 and 0.005 mm; the normal force at rest was 1.2 % off with 20 rows instead
# of 12 per rod).
SOFT_CONDIMS = (3, 4, 6)


def contact_options(params: PhysicalParameters, chosen: Sequence[str] = ()) -> tuple[str, ...]:
    """The `CONTACT_OPTIONS` that would change ``params``' structure: not one of ``chosen``
    (the options it was built with), nor a split it already has."""
    names = []
    for name in CONTACT_OPTIONS:
        option = OPTIONS[name]
        if name in chosen or (option.per_element and all(n in params.per_element for n in option.per_element)):
            continue
        if "rod_mass" in option.per_element and params.robot.num_rods < 2:
            continue
        names.append(name)
    return tuple(names)


def contact_fit_config(start: PhysicalParameters, options: Sequence[str],
                       config: IdentificationConfig) -> IdentificationConfig:
    """``config`` for fitting ``start``'s contact law's values plus ``options``' (the values an
    option splits per element are learnt, on top of ``start``'s own splits), in its step."""
    learn, split, _ = structure_config(options, start.robot, contact_params(start.robot.contact.law))
    learn += tuple(n for n in split if n not in learn)
    per_element = tuple(dict.fromkeys(tuple(start.per_element) + split))   # the trainer splits start
    return dataclasses.replace(config, learn=learn, per_element=per_element, fine_integrator=start.robot.integrator,
                               init="given")


def select_contact_law(params: PhysicalParameters, train: Sequence[Trajectory], heldout: Sequence[Trajectory],
                       config: IdentificationConfig, *, laws: Sequence[str] = ("penalty", "soft"),
                       condims: Sequence[int] = SOFT_CONDIMS,
                       options: Optional[Sequence[str]] = None, chosen: Sequence[str] = (),
                       horizon: float = 1.0, stride: float = 0.5, min_gain: float = 0.05, sigmas: float = 2.0,
                       min_base_share: float = 0.02, min_path_share: float = 1e-3,
                       screen_patience: Optional[int] = SCREEN_PATIENCE,
                       log: Callable[[str], None] = lambda m: None) -> StructureSelection:
    """The ground contact law the robot's contact data asks for, and the structure options
    contact data reveals best (``options``, default `contact_options` less ``chosen``, the
    options ``params`` was built with: a mass per rod, slack-cable damping): from
    ``params`` (its non-contact values, its structure), the contact values are fitted under
    each law in ``laws`` (the robot's own first: the incumbent), alone and with each option's
    values, on ``train`` rolling trajectories, each judged ``horizon`` ahead on ``heldout``
    ones (whose tuples also stop each fit); a candidate replaces the best so far only as a
    structural option does (`select_structure`: ``min_gain`` relative, ``sigmas`` standard
    errors of the paired per-window log ratio; a candidate with an option, which adds values,
    also by the absolute floor, ``min_base_share`` of the base's error and ``min_path_share``
    of the path). ``config`` sets the budget and solver (``screen_patience`` as in
    `select_structure`); its ``learn`` is each law's contact values (plus the option's).
    Under the soft law the contact dimensionality is structure too: the robot's own and each
    other of ``condims`` (MuJoCo's condim 3, 4, 6; () keeps the robot's), tried once the law
    and options are chosen, with them.
    Candidates are labelled by their law ("soft_contact" for the soft law), a dimensionality
    other than the robot's own ("condim4") and options."""
    unknown = set(options or ()) - set(OPTIONS)
    if unknown:
        raise ValueError(f"unknown structure options {sorted(unknown)}; known: {sorted(OPTIONS)}")
    unknown_dims = set(condims) - set(SOFT_CONDIMS)
    if unknown_dims:
        raise ValueError(f"unknown contact dimensionalities {sorted(unknown_dims)}; known: {list(SOFT_CONDIMS)}")
    extra = tuple(options) if options is not None else contact_options(params, chosen)
    if any(OPTIONS[name].integrator for name in extra):
        raise ValueError("the contact stage keeps the structure's step: no integrator options")
    own = params.robot.contact.law
    order = [own] + [law for law in laws if law != own]
    config = _screening(config, screen_patience)
    heldout = [with_estimated_velocity(t) for t in heldout]
    train_tuples = tuples_from(list(train), config.period)
    # the held-out tuples also stop each fit and pick its best iterate, as a single contact
    # fit does (`ProgressiveTrainer.set_data`'s validation data)
    val_tuples = tuples_from(list(heldout), config.period)

    def fit(start: PhysicalParameters, law_label: tuple, added: tuple) -> Candidate:
        law = start.robot.contact.law
        cfg = contact_fit_config(start, added, config)
        cand = _fitted_candidate(law_label + added, start.robot, start, cfg, (train_tuples, val_tuples), heldout,
                                 horizon, stride)
        log(f"contact {'+'.join(law_label + added) or law}: {1e3 * cand.error:.2f} mm {horizon:g} s ahead "
            f"({cand.wall:.0f} s)")
        return cand

    # round 1: each law alone and with each option (laws and options interact: a payload's
    # masses are what make the soft law fit on the zoo's `payload`, which alone fits worse
    # than the penalty law), each judged against the best so far
    candidates = []
    for law in order:
        start = with_contact_law(params, law)
        for added in [()] + [(name,) for name in extra]:
            candidates.append((start, fit(start, () if law == "penalty" else (f"{law}_contact",), added)))
    (best_start, base), best = candidates[0], candidates[0][1]
    floor = _gain_floor(base, heldout, horizon, min_base_share, min_path_share)
    tried = []
    for start, cand in candidates[1:]:
        adds = any(name in cand.options for name in extra)
        ok, verdict = _paired_verdict(cand.errors, best.errors, min_gain, sigmas, floor if adds else 0.0)
        tried.append((1, cand, verdict))
        if ok:
            best, best_start = cand, start
    # round 2: under the soft law, the other contact dimensionalities with what round 1 kept;
    # a higher one brings friction values to life (torsional, rolling): the floor too
    if best_start.robot.contact.law == "soft":
        law_label = tuple(o for o in best.options if o.endswith("_contact"))
        added = tuple(o for o in best.options if not o.endswith("_contact"))
        dim = best_start.robot.contact.soft_condim
        for c in dict.fromkeys(condims):
            if c == dim:
                continue
            cand = fit(with_contact_law(best_start, "soft", c), law_label + (f"condim{c}",), added)
            ok, verdict = _paired_verdict(cand.errors, best.errors, min_gain, sigmas, floor if c > dim else 0.0)
            tried.append((2, cand, verdict))
            if ok:
                best = cand
    return StructureSelection(chosen=best, base=base, tried=tried, horizon=horizon)


def refit_noncontact(contact: StructureSelection, train: Sequence[Trajectory], heldout: Sequence[Trajectory],
                     config: IdentificationConfig, *, chosen: Sequence[str] = (), base_learn: Sequence[str] = BASE_LEARN,
                     horizon: float = 1.0, stride: float = 0.5) -> Optional[Candidate]:
    """The non-contact values refitted on non-contact data (``train``, judged ``horizon``
    ahead on ``heldout``) in the structure the contact stage (``contact``,
    `select_contact_law`) left: its splits kept (a mass per rod, each refitted where the
    data moves it: a hung rod's mass, which it cannot, stays the contact stage's), the
    values its options added held (the slack share) and the contact values held. The
    values a hanging fit found without those options carry their compensation, and the
    rolling fit's masses theirs (measured on the zoo's three-bar ``payload``: hanging 1 s
    ahead 5.5 mm with the hanging stage's values and the rolling stage's masses per rod).
    A contact law the stage changed reaches non-contact data too where rods touch each other
    (the soft law's rod pairs, `physics.soft_pairs`): the hanging values fitted under the old
    law carry its error (measured on the zoo's ``noisy_mocap``: the rod pairs' law alone took
    hanging 1 s ahead from 1.90 to 0.00 mm with the true values), so they are refitted then
    too. ``chosen`` are the non-contact options the structure was selected with; the values
    refitted are ``config.learn``'s (else ``base_learn``) and theirs. None if the contact
    stage added no option and changed no law that acts between rods."""
    added = [name for name in contact.chosen.options if name in CONTACT_OPTIONS]
    robot, before = contact.chosen.params.robot, contact.base.params.robot
    law_between_rods = (_contact_structure(robot) != _contact_structure(before) and robot.contact.rod_rod
                        and robot.num_rods > 1)
    if not added and not law_between_rods:
        return None
    params = contact.params
    held = {n for name in added for n in OPTIONS[name].learn}
    learn, _, _ = structure_config(chosen, params.robot, tuple(config.learn) if config.learn else base_learn)
    learn = tuple(n for n in learn if n not in held)
    # Levenberg-Marquardt from the fitted values: no coarse stage, whose force-scale search
    # would scale every mass, a hung rod's too
    cfg = dataclasses.replace(config, learn=learn, per_element=tuple(params.per_element),
                              fine_integrator=params.robot.integrator, init="given", schedule="fine_only")
    heldout = [with_estimated_velocity(t) for t in heldout]
    return _fitted_candidate(contact.chosen.options, params.robot, params, cfg, (tuples_from(list(train), config.period),),
                             heldout, horizon, stride)
