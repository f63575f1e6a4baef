"""Structure options tried while the robot works (`OnlineIdentification`'s challengers).

Offline, `structure.select_structure` fits every option on hanging data. Online there is
only what the robot does on the floor, and no time to fit every option at once. Here one
option at a time is fitted by a *challenger*: a second trainer on the training window as it
was when it started (a problem that grows under it every 5 s of data does not converge on
one core: measured, `bench/online.py` at 120 s), with the option's values learnt as well.
It starts from the config's values once the gate can judge, takes one second of the
worker's compute in ``CHALLENGER_SHARE`` while the solver trains and every epoch while the
solver waits for new tuples. Every ``JUDGE_EVERY`` of its epochs and when its schedule ends, it is judged on the held-out
blocks by the session's gate with a stricter test than a candidate of the same structure
(more parameters must pay for themselves: a lower held-out loss by
``STRUCTURE_SIGNIFICANCE`` standard errors of the per-block log ratio *and* by
``STRUCTURE_MIN_GAIN`` of the loss, no larger CoM error, better than the published model,
the config, and the solver's current fit). Adopted, it becomes the session's trainer on the
window as it is now and ends like the solver (the caller's gate and convergence test, then
publication); its values are learnt from then on, under the session's budget. Its end, a
divergence, or ``FUTILE_LOOKS`` looks in a row with a held-out loss above the model it must
beat refuse it. Refused, failed or over its own budget, the option waits until
twice the held-out tuples have been seen, or until another option is adopted (it was
refused against the structure before), before it is tried again.

An option adopted before its challenger's end is offered to the caller's gate at once
(`OnlineIdentification.step` returns its values).

Options of these kinds can be tried online:
- *value* options add values the parameter message carries (end-heavy rods, slack-cable
  damping, a winch speed limit);
- *structure* options change how the model is built: its integrator (``implicitfast``,
  ``rk4``: MuJoCo's), for a config under the penalty law the soft ground law
  (``soft_contact``: its solref learnt where the penalty stiffness and damping were) and,
  under the soft law, the contact dimensionality (``condim_3``, ``condim_4``, ``condim_6``).
  The message carries them too (``integrator``, ``contact_condim``: > 0 is the soft law),
  and a consumer plans with the structure the values were fitted in. A challenger of
  another structure is scored in its own structure, the model it would
  replace in that model's (`OnlineIdentification.gate`). At most one integrator, one law and
  one contact dimensionality are adopted, as offline (`structure.select_structure`,
  `structure.select_contact_law`);
- a *start* option (``fresh_start``) changes neither model nor values: its challenger starts
  the windowed stage from the config's values rather than from the finite-difference fit
  (`IdentificationConfig.windows_from`), whose biased velocities can lead the solver into a
  basin where wrong values compensate each other (the four-bar's payload robot, docs/online_identification.md).
  Two minima of one model on one data set: the lower one on the solver's own objective over
  the training windows wins (`StructureTrials._start_verdict`), not the structure test.
  ``swapped_lags`` starts its windows from the solver's values as they stand with the
  motor's lag and the cables' exchanged (`swapped_lags`): the mirror image under the one
  near-symmetry the four-bar's drawn robots fell into. ``long_windows`` goes on from the
  solver's values as they stand on windows twice as long: the short windows find the basin
  (from finite differences, windows of 6 put kitchen_sink in its fast-motor basin on 4 of 5
  seeds), the long ones tell lags apart that the short ones trade (spring_driven: the
  motor's lag +5 to +19 % on windows of 3 x 100 ms, against its and the cables' lags of
  125 and 214 ms). It starts once the solver's fit has converged, where both lags outlast
  a third of a window (`SLOW_LAG_SHARE`), and its objective is not the solver's, so the
  held-out blocks judge it at the structure test: at the gate's own, payload seed 4
  adopted long windows refined from a fit not yet converged, and its CoM error 1 s ahead on
  fresh data went 4.9 -> 38 mm;
- *per-element* options give learnt values one entry per cable (``per_cable``: stiffness and
  damping; ``per_cable_stiffness``: stiffness alone) or per free rod (``per_rod_mass``). The
  message carries them as arrays, and the gate scores a model of either kind exactly
  (`acceptance.heldout_scores` reads the split from the values' lengths). The challenger
  then has 33-57 values to learn (SUPERball) where the solver has 9: 3-4x its epochs' cost on
  a CPU.
"""
from __future__ import annotations

import dataclasses
import math
from typing import Optional, Sequence

import numpy as np

from tensegrity_engine.identification.acceptance import window_fit
from tensegrity_engine.identification.config import (COARSE_ONLY_SCHEDULES, CONTACT_PARAMS, IdentificationConfig,
                                                     contact_params)
from tensegrity_engine.identification.lag_split import motor_and_cable_lags, swapped_lags
from tensegrity_engine.identification.solvers.windows import inherit_windows
from tensegrity_engine.identification.uncertainty import bound_sides
from tensegrity_engine.identification.worker_account import TimedCall
from tensegrity_engine.physics.config import MODEL_INTEGRATORS, RobotConfig
from tensegrity_engine.physics.params import SOFT_LAW_PARAMS, SPEC_BY_NAME, PhysicalParameters

__all__ = ["ONLINE_OPTIONS", "DEFAULT_STRUCTURE_OPTIONS", "OnlineOption", "online_options", "StructureTrials",
           "healthy_values", "CHALLENGER_SHARE", "FUTILE_LOOKS", "JUDGE_EVERY", "STRUCTURE_SIGNIFICANCE",
           "STRUCTURE_MIN_GAIN", "START_MIN_GAIN", "START_WINDOWS", "PIN_OPTIONS", "PIN_EPOCHS", "URGENT_JUDGE_EVERY", "structure_robot",
           "structure_key", "robot_in_structure", "solvers_windows", "windows_origin", "learn_with",
           "lags_outlast_windows", "SLOW_LAG_SHARE"]


@dataclasses.dataclass(frozen=True)
class OnlineOption:
    learn: tuple = ()                  # values the option adds
    integrator: Optional[str] = None   # the model's step
    condim: Optional[int] = None       # the soft ground law's contact dimensionality
    per_element: tuple = ()            # learnt values it gives one entry per cable / rod
    law: Optional[str] = None          # the ground contact law (its contact values learnt instead)
    windows_from: Optional[str] = None  # where the windowed stage starts (`IdentificationConfig.windows_from`)
    # a start option's start values: None the config's, "swapped_lags" the solver's with the
    # motor's and the cables' lags exchanged (`swapped_lags`), "solver" the solver's as they are
    start: Optional[str] = None
    # its windows are this many times the solver's (`IdentificationConfig.pose_window`)
    window_factor: int = 1


# `structure.OPTIONS` and `structure.SOFT_CONDIMS`, with the same names; ``soft_contact``:
# `structure.select_contact_law`'s soft law for a config under the penalty law;
# ``per_cable_stiffness``, online only: what a pin points to (`PIN_OPTIONS`)
ONLINE_OPTIONS = {
    "end_heavy": OnlineOption(learn=("rod_inertia_factor",)),
    "slack_damping": OnlineOption(learn=("cable_slack_damping",)),
    "winch_speed": OnlineOption(learn=("actuator_max_speed",)),
    "implicitfast": OnlineOption(integrator="implicitfast"),
    "rk4": OnlineOption(integrator="rk4"),
    "soft_contact": OnlineOption(law="soft"),
    "condim_3": OnlineOption(condim=3),
    "condim_4": OnlineOption(condim=4),
    "condim_6": OnlineOption(condim=6),
    "per_cable": OnlineOption(per_element=("cable_stiffness", "cable_damping")),
    "per_cable_stiffness": OnlineOption(per_element=("cable_stiffness",)),
    "per_rod_mass": OnlineOption(per_element=("rod_mass",)),
    "fresh_start": OnlineOption(windows_from="start"),
    "swapped_lags": OnlineOption(windows_from="start", start="swapped_lags"),
    "long_windows": OnlineOption(windows_from="start", start="solver", window_factor=2),
}
# The values a start option (by name) needs learnt: the lags it exchanges, or tells apart
_LAGS = ("cable_damping", "actuator_time_constant")
START_NEEDS = {"swapped_lags": _LAGS, "long_windows": _LAGS}

# What a session tries when its caller names nothing: the soft ground law for a robot whose
# YAML has the penalty law (the schema's default; `next_option` skips it under the soft law),
# then, where both lags are slow (`SLOW_LAG_SHARE`), long windows, then a fresh start of the
# windowed stage. A robot YAML written without a law is played by
# MuJoCo's soft contacts in sim2sim. Measured on the four-bar's zoo (9 robots x 2 seeds on the
# work clock, each law priced: docs/online_identification.md): the law adopted on 16 of 18 runs, the published
# model's CoM error 1 s ahead 456 -> 247 mm summed. The fresh start, on top (2026-12-01, the
# same runs): adopted on 3 of 18, each a basin left (damping +56 / +204 / +1091 % -> +10 /
# +32 / +169 %), CoM summed 251 -> 238 mm, within tolerance 5 -> 3 of 18 (runs near the line
# lose the solver's share); on the SUPERball's zoo (7 robots x 2 seeds) 14 of 14 within
# tolerance either way, CoM 154 -> 142 mm (docs/online_identification.md). The held-out gate decides, so a robot
# the penalty law or the first fit predicts better keeps it.
DEFAULT_STRUCTURE_OPTIONS = ("soft_contact", "long_windows", "fresh_start")
# ``long_windows`` is offered only where the motor's lag and the cables' (c / k) of the
# solver's fit both outlast this share of its windows' span (`lags_outlast_windows`): a lag
# that settles within a window (95 % in three time constants) shows its whole response there,
# and the short windows tell it from the other; two that outlast it trade. Measured with the
# option offered on every robot (`bench/online.py --structure
# soft_contact,long_windows,fresh_start`, 9 robots x 5 seeds, 2026-12-07): spring_driven (125
# and 214 ms on windows of 3 x 100 ms) 1 -> 4 of 5 within tolerance; noisy_mocap (25 and 300
# ms) 4 -> 2 (its motor's lag +15 and +52 %); payload (75 and 23 ms) its damping 5.8 -> 7.3 %
# (median); the others as before. With the rule (2026-12-08): spring_driven 4 of 5, the other
# eight robots (their shorter lag 23-86 ms) to the digit as without the option.
SLOW_LAG_SHARE = 1.0 / 3.0
# As offline selection (`select_structure`: 2 standard errors, 5 % gain).
STRUCTURE_SIGNIFICANCE = 2.0
STRUCTURE_MIN_GAIN = 0.05
# A start option (`fresh_start`) wins on the solver's objective over the training windows by
# this much (`StructureTrials._start_verdict`): two local minima of one model, not a tie.
START_MIN_GAIN = 0.01
# ... scored on at most this many of the training windows (an even subset, the same for both):
# each window's start velocity is fitted afresh for each set of values, ~0.1 s of a core per
# SUPERball window, and the worker does nothing else meanwhile (all ~130 windows at 40 s of
# data: 25 s, in which the sim2sim's solver neither trained nor published)
START_WINDOWS = 32
# A challenger's own budget: one that never passes its convergence test (a winch limit the
# robot never reaches: a flat direction) must not hold the other options back for good.
CHALLENGER_MAX_EPOCHS = 60
# A challenger's finite-difference stage (pose-only) moves on to its windows after this many
# iterations, on the windows and fitted latents of the session's solver where they index its
# tuples (`_epoch`): it finds the basin from the config's values; the windows remove its
# velocities' bias, and with a value per cable each of its iterations on the whole window costs
# more than a windowed one (kitchen_sink: 1.4-6.1 s of work against 1.2-2.3 s). An adopted
# challenger keeps the cap (`OnlineIdentification.adopt`); the session's first solver has none.
# Uncapped once adopted, kitchen_sink's per-cable split (adopted after 2 epochs, at 20-25 s)
# was still in its finite differences at 60 s, the damping 37-80 % high on 4 of 5 seeds;
# capped, its windows took 3 of the 5 within 10 % (the damping +0.1 to +8.3 %).
CHALLENGER_FD_ITERS = 3
CHALLENGER_MAX_SECONDS = 120.0
# A running challenger is also judged every this many of its epochs, and adopted then if it
# already wins; refused then only once it trails (`FUTILE_LOOKS`). On the floor the solver seldom
# waits, and a challenger that fits everything anew may end after the robot's first minute
# (measured: slow_winch's winch speed, started at 16-29 s, converged at 55 s and later). The
# looks reuse the held-out data, so they pass a useless option more often than one test
# would; the 5 % minimum gain on held-out data keeps that rare (`bench/online.py`, docs/online_identification.md).
JUDGE_EVERY = 5
# While the solver trains, a challenger takes one second of the worker's compute in this many
# (`StructureTrials.challengers_turn`). Measured (docs/online_identification.md, 8 robots x 3
# seeds, implicitfast and winch_speed, then one epoch in this many): one in three kept no solver
# closer to the truth than one in two and left every challenger later; the futility stop
# (below) is what saves the solver's time. Counted in time, not epochs: a challenger that fits
# from the config's values (`fresh_start`) takes 5-10x the solver's time per epoch, so one epoch
# in two gave it ~85 % of the worker (sim2sim on soft_slow: its 5 epochs 35 s against the
# solver's 6, which then did not converge before the controller's 90 s excitation limit).
CHALLENGER_SHARE = 2
# A challenger whose held-out loss is above the fit it must beat at this many looks in a row
# (its point estimate, not its significance) is refused then: an option that changes nothing
# (the twin's own integrator's neighbour) or explains nothing would otherwise hold the solver's
# share for its whole budget. A refused option is tried again on twice the held-out data.
# Only looks taken while the solver trains beside it count: while the solver waits for new
# data (converged) the challenger costs it nothing, and one that refits from the config's
# values (`fresh_start`) trails by construction at its first looks.
FUTILE_LOOKS = 3
_NOT_BETTER = "no better than the base fit"     # `_verdict`'s prefix when the base fit wins
# A value the solver's fit pins at one end of its range (`uncertainty.bound_sides`; `PIN_EPOCHS`), and the
# option that gives the model the structure whose absence pins it there
# (`identifiability.BOUND_HINTS` says it in words; measured there). Followed (``follow_pins``)
# it is tried next, whatever the options, before the one running, and is not refused early
# (`FUTILE_LOOKS`): the solver's values are a compensation then, and a split fitted from the
# config's values trails at first. It keeps the usual share until a model is published (the
# solver's is the one published meanwhile: taking every epoch from the start, stiff_light's
# solver was starved before its first publication), then takes every epoch (measured:
# kitchen_sink's split, started at 15 s, was not judged by 60 s at half the epochs).
# The rods' inertia factor at its top (4: beyond 3, all of a rod's mass at its ends, so no
# rod's) came with the same spread: on 9 of the 10 runs of the SUPERball zoo's two robots whose
# cables differ, on none of the other 35 (`bench/online.py`, 2026-12-02).
# The split is the cables' stiffness alone: their spread shows in the robot's shape under
# tension, which the poses see; a damping per cable adds nothing they can tell (kitchen_sink
# seeds 1 and 2, the CoM error 1 s ahead on fresh data with the robot's true values: shared
# 30.3 / 76.8 mm, per-cable stiffness 7.4 / 6.9, both per cable 6.0 / 6.5, damping alone
# 30.7 / 76.7), and 24 values fewer to fit within the robot's first minute (5 seeds each of
# kitchen_sink and stiff_light: the split adopted on 3 and 2 runs against 3 and 3, the
# published CoM error 1 s ahead, median, 28.6 and 145.9 mm against 30.3 and 147.4).
PIN_OPTIONS = {("actuator_time_constant", "lower"): "per_cable_stiffness",
               ("rod_inertia_factor", "upper"): "per_cable_stiffness"}
# What pins pointed to before (until 2026-12-02 both cable values were split): a checkpoint
# that adopted it for a pin restores it, where pins are followed
EARLIER_PIN_OPTIONS = ("per_cable",)
# A pin counts once the solver's fit has ended at it, or sat at it this many epochs in a row:
# values on their way pass near a bound, and on the floor the solver seldom ends (measured:
# kitchen_sink, time constant pinned at 60 s, the solver ended 0 times).
PIN_EPOCHS = 3
# A split a pin started is judged every this many of its epochs, each ~4x the solver's
# (measured: kitchen_sink's split adopted on 3 of 5 seeds at 2, on 2 at `JUDGE_EVERY`; the
# held-out CoM error 1 s ahead, median, 35.2 against 51.2 mm; stiff_light's -6 to +11 %)
URGENT_JUDGE_EVERY = 2
# ...and it need only predict the held-out blocks better by the gate's own test (1 standard
# error, no minimum gain), not the structure test's: the base it would replace is a
# compensation (its values publish no sigma), so the split's extra values need not pay for
# themselves twice. Measured (kitchen_sink seed 0 at the 2026-12-07 prices): the base's time
# constant at 2 ms and inertia factor at its top (K / c / tau +125 / +1805 / -99 %); the
# split, not significantly better at four looks, was refused at its end; by this test it
# was adopted after 10 epochs and ended at -5.6 / -3.3 / -0.7 %.
PIN_SIGNIFICANCE = 1.0     # `online.GATE_SIGNIFICANCE`


def _trails(reason: str) -> bool:
    """A verdict (`StructureTrials._verdict`'s) whose held-out mean loss is above the model's
    it was compared with (`online._compare`'s "worse", the gate's "unstable"): not merely not
    significantly lower, nor lower with the CoM further off. The gate's "worse_than_config"
    (better than the published model, not than the config) does not count: the challenger is
    not behind the model it would replace."""
    if reason.startswith(_NOT_BETTER):
        reason = reason[len(_NOT_BETTER):].strip(" ()")
    return reason.split(":", 1)[0] in ("worse", "unstable")      # "worse: <what>" too


def _at_bounds(trainer) -> tuple:
    """(name, side) of each learnt value of ``trainer`` at a bound of its range now."""
    return tuple((n, side) for n in getattr(trainer, "learn", ()) for side in bound_sides(trainer.parameters, n))


def healthy_values(values: dict) -> bool:
    """Every value finite (`OnlineIdentification` and its challengers)."""
    return all(np.isfinite(np.asarray(v, dtype=np.float64)).all() for v in values.values())


def structure_key(robot: RobotConfig) -> tuple:
    """What of a model's build its values do not say: the integrator and the ground law
    with, under the soft law, its contact dimensionality."""
    contact = robot.contact
    return robot.integrator, contact.law, contact.soft_condim if contact.law == "soft" else None


def structure_robot(robot: RobotConfig, names: Sequence[str]) -> RobotConfig:
    """``robot`` built with the structure options ``names`` (value options change nothing
    here; a later step or condim option overrides an earlier one)."""
    for name in names:
        option = ONLINE_OPTIONS[name]
        robot = _rebuilt(robot, option.integrator or robot.integrator, option.condim, option.law)
    return robot


def _rebuilt(robot: RobotConfig, integrator: str, condim: Optional[int], law: Optional[str] = None) -> RobotConfig:
    """``robot`` stepped with ``integrator`` and, unless None, under the ground ``law`` (the
    config's solref, solimp and friction: MuJoCo's defaults where it sets none) and of
    contact dimensionality ``condim`` (``robot`` itself when nothing changes)."""
    if integrator != robot.integrator:
        robot = robot.replace(integrator=integrator)
    if law is not None and law != robot.contact.law:
        robot = robot.replace(contact=dataclasses.replace(robot.contact, law=law))
    if condim is not None and int(condim) != robot.contact.soft_condim:
        robot = robot.replace(contact=dataclasses.replace(robot.contact, condim=int(condim)))
    return robot


def robot_in_structure(robot: RobotConfig, key) -> RobotConfig:
    """``robot`` built in the structure ``key`` (`structure_key`'s (integrator, ground law,
    soft-law condim), e.g. from a checkpoint: checked). The law is ``robot``'s own or the
    soft one (`soft_contact`, the one law option)."""
    integrator, law, condim = key
    if integrator not in MODEL_INTEGRATORS:
        raise ValueError(f"unknown integrator {str(integrator)[:32]!r}")
    if law not in (robot.contact.law, "soft"):
        raise ValueError(f"a model under the {str(law)[:32]!r} ground law, not {robot.contact.law!r} or 'soft'")
    if condim is not None and (law != "soft" or int(condim) not in (1, 3, 4, 6)):
        raise ValueError(f"contact dimensionality {condim!r}")
    return _rebuilt(robot, integrator, condim, law)


def _splits(option: OnlineOption, robot: Optional[RobotConfig], learnt: Sequence[str],
            split: Sequence[str], fixed_rods: Sequence[int]) -> bool:
    """A per-element ``option`` would split a learnt value that is not split yet, over two or
    more cables (or free rods: a fixed rod's mass acts on nothing)."""
    names = [n for n in option.per_element if n in learnt and n not in split]
    if not names or robot is None:
        return bool(names)
    cables = robot.num_cables
    free_rods = robot.num_rods - len(set(fixed_rods))
    return all((free_rods if SPEC_BY_NAME[n].group == "rod" else cables) >= 2 for n in names)


def _kind(option: OnlineOption) -> Optional[str]:
    return ("integrator" if option.integrator else "condim" if option.condim
            else "law" if option.law else (option.start or "start") if option.windows_from else None)


def _windows_from(trainer) -> Optional[str]:
    """Where ``trainer``'s windowed stage starts; None if it has none (data with velocities,
    a schedule without Levenberg-Marquardt or without a fine stage)."""
    config = getattr(trainer, "config", None)
    if (config is None or not getattr(trainer, "latent", False) or config.fine_optimizer != "lm"
            or config.schedule in COARSE_ONLY_SCHEDULES):
        return None
    return config.windows_from


def windows_origin(adopted: Sequence[str], main, config: IdentificationConfig) -> Optional[str]:
    """Where the values of ``main``'s windowed stage come from (`_windows_from`; None: it has
    none). An ``adopted`` option that starts from the solver's values (``long_windows``) runs
    its windows from those, so its trainer says "start"; the values it refined came from
    where the solver's did: from ``config``'s origin, unless a start option that starts
    elsewhere was adopted too. Else a fresh start would never be tried after it."""
    origin = _windows_from(main)
    starts = [ONLINE_OPTIONS[n] for n in adopted if ONLINE_OPTIONS[n].windows_from is not None]
    if origin is not None and starts and all(o.start == "solver" for o in starts):
        return config.windows_from
    return origin


def lags_outlast_windows(values: dict, span: float) -> bool:
    """The motor's lag and the cables' of ``values`` (`lag_split.motor_and_cable_lags`) both
    at least `SLOW_LAG_SHARE` of a window's ``span`` (s): where windows twice as long can tell
    them apart (``long_windows``). False without the three values."""
    lags = motor_and_cable_lags(values)
    return lags is not None and all(lag >= SLOW_LAG_SHARE * span for lag in lags)     # NaN: False


def solvers_windows(trainer, solver) -> bool:
    """A pose-only ``trainer`` in its windowed stage that has drawn no windows yet takes those
    of ``solver`` that index its tuples, with their fitted latents
    (`solvers.windows.inherit_windows`), rather than fitting each from its finite-difference
    velocities (kitchen_sink's per-cable challenger: 11.2 s of work for its first windowed
    epoch on 44 windows). True if it took any."""
    lm = getattr(trainer, "window_lm", None)
    if not getattr(trainer, "latent", False) or not getattr(getattr(trainer, "schedule", None), "windows", False) \
            or lm is None or lm.windows is not None:
        return False
    if not inherit_windows(lm, trainer, getattr(solver, "window_lm", None), getattr(solver, "train", None)):
        return False
    trainer.log(f"windows: {lm.windows.shape[0]} of the solver's, their latents kept")
    return True


def learn_with(learn: Sequence[str], names: Sequence[str]) -> tuple[str, ...]:
    """``learn`` with the options' values added and, under another ground law, the
    contact values of the old law swapped for the new one's (`config.contact_params`)."""
    out = list(learn)
    for name in names:
        option = ONLINE_OPTIONS[name]
        out += [n for n in option.learn if n not in out]
        if option.law is not None:
            new = contact_params(option.law)[:2]            # the law's normal response
            old = [n for n in CONTACT_PARAMS[:2] + SOFT_LAW_PARAMS if n not in new]
            if any(n in out for n in old):
                out = [n for n in out if n not in old] + [n for n in new if n not in out]
    return tuple(out)


def online_options(names: Sequence[str]) -> tuple[str, ...]:
    """``names`` checked: known online options, each once (ValueError otherwise)."""
    out = []
    for name in names:
        if name not in ONLINE_OPTIONS:
            raise ValueError(f"structure option {name!r} cannot be tried online; online options: "
                             f"{', '.join(ONLINE_OPTIONS)}")
        if name not in out:
            out.append(name)
    return tuple(out)


class StructureTrials:
    """Which options are adopted, refused (and on how much held-out data), and the running
    challenger. The session owns the data and the gate; this owns the bookkeeping."""

    def __init__(self, options: Sequence[str] = (), follow_pins: bool = True):
        self.options = online_options(options)
        self.follow_pins = bool(follow_pins)
        self.reset()

    def reset(self) -> None:
        self.adopted: list[str] = []
        self.refused: dict[str, int] = {}     # option -> held-out tuples (ever) when it was refused
        self.challenger = None                 # the running challenger trainer
        self.option: Optional[str] = None      # the option it tries
        self.base_values: Optional[dict] = None   # the solver's values when it started
        self.challenger_epochs = 0             # epochs the running challenger has trained
        self.challenger_seconds = 0.0          # the worker's compute it took (the session's clock)
        self.solver_seconds = 0.0              # and the solver's beside it, since it started
        self.trailing = 0                      # its looks in a row with a held-out loss above the base's
        self.urgent = False                    # it runs for a value the solver's fit pins (`PIN_OPTIONS`)
        self.pin_streak: dict = {}             # (name, side) -> the solver's epochs in a row pinned there
        self.log: list[tuple[str, str]] = []   # (option, verdict) in the order they were judged

    @property
    def active(self) -> bool:
        return self.challenger is not None

    def next_option(self, heldout_total: int, robot: Optional[RobotConfig] = None,
                    floor: bool = True, learnt: Sequence[str] = (), split: Sequence[str] = (),
                    fixed_rods: Sequence[int] = (), windows_from: Optional[str] = "finite_difference",
                    pinned: Sequence[tuple] = (), converged: bool = True,
                    slow_lags: bool = False) -> Optional[str]:
        """The next option worth a challenger: neither adopted nor running, one that changes
        ``robot`` (the session's structure; a contact dimensionality only on the floor under
        the soft law; none of a kind already adopted), that adds a value the solver does
        not learn already (``learnt``) or splits learnt values it does not split already
        (``split``; over two or more cables, or free rods: not ``fixed_rods``), that starts
        the windowed stage elsewhere than the solver does (``windows_from``; None: the solver
        has no windowed stage) and, if
        refused (or failed), refused on at most half of the held-out tuples seen since the
        start. An option that refines the solver's values (``start="solver"``) only once the
        solver's fit has ``converged`` (its convergence test passed): refined on its way, an
        unconverged fit's errors stay (payload seed 4: K +18 % at 15 s, which the solver left
        later, kept by the long windows to the end); one with longer windows only where the
        solver's lags outlast its windows (``slow_lags``: `lags_outlast_windows`). First the
        options ``pinned`` (name, side) pairs point to (`PIN_OPTIONS`), where pins are
        followed, listed or not."""
        taken = {_kind(ONLINE_OPTIONS[n]) for n in self.adopted} - {None}
        for name in dict.fromkeys(self.pin_options(pinned) + self.options):
            option = ONLINE_OPTIONS[name]
            if name in self.adopted or name == self.option or _kind(option) in taken:
                continue
            if option.learn and set(option.learn) <= set(learnt):
                continue
            if option.per_element and not _splits(option, robot, learnt, split, fixed_rods):
                continue
            if option.windows_from is not None:
                if windows_from is None:
                    continue
                if option.start is None and option.windows_from == windows_from:
                    continue
                if not set(START_NEEDS.get(name, ())) <= set(learnt):
                    continue
                if (option.start == "solver" and not converged) or (option.window_factor > 1 and not slow_lags):
                    continue
            elif robot is not None and option.learn == () and not option.per_element \
                    and structure_key(structure_robot(robot, (name,))) == structure_key(robot):
                continue
            if option.condim is not None and (not floor or (robot is not None and robot.contact.law != "soft")):
                continue
            if option.law is not None and not floor:      # the law acts mostly on the floor
                continue
            if name in self.refused and heldout_total < 2 * self.refused[name]:
                continue
            return name
        return None

    def challengers_turn(self) -> bool:
        """While both train, the challenger's epoch is next as long as its compute since it
        started is within its share (`CHALLENGER_SHARE`) of the two's."""
        return self.challenger_seconds * (CHALLENGER_SHARE - 1) <= self.solver_seconds

    def observe(self, session) -> None:
        """After each epoch of ``session``'s solver: count its pins (`PIN_EPOCHS`), and start
        a challenger where none runs beside a training solver or a pin is due."""
        main = session.trainer
        now = _at_bounds(main)
        self.pin_streak = {p: self.pin_streak.get(p, 0) + 1 for p in now}
        if (not self.active and not main.done) or (not self.urgent and self.pin_options(self._counted(main, now))):
            self.maybe_start(session)

    def pins(self, main) -> tuple:
        """The (name, side) pins of the solver ``main`` that count: at a bound when its fit
        ended, or for `PIN_EPOCHS` of its epochs in a row."""
        return self._counted(main, _at_bounds(main))

    def _counted(self, main, now: tuple) -> tuple:
        if getattr(main, "done", False):
            return now
        return tuple(p for p in now if self.pin_streak.get(p, 0) >= PIN_EPOCHS)

    def pin_options(self, pinned: Sequence[tuple]) -> tuple[str, ...]:
        """The options the ``pinned`` (name, side) pairs point to (`PIN_OPTIONS`); none
        unless pins are followed."""
        return tuple(PIN_OPTIONS[p] for p in pinned if p in PIN_OPTIONS) if self.follow_pins else ()

    @classmethod
    def config_with(cls, config: IdentificationConfig, learn: Sequence[str],
                    names: Sequence[str]) -> IdentificationConfig:
        """``config`` learning ``learn`` with the options ``names``: their values added, and
        their splits of learnt values to the per-element ones it has."""
        learn, split = learn_with(learn, names), list(config.per_element)
        windows_from, width = config.windows_from, config.pose_window
        for name in names:
            split += [n for n in ONLINE_OPTIONS[name].per_element if n in learn and n not in split]
            windows_from = ONLINE_OPTIONS[name].windows_from or windows_from
            width *= ONLINE_OPTIONS[name].window_factor
        return dataclasses.replace(config, learn=learn, per_element=tuple(split), windows_from=windows_from,
                                   pose_window=width)

    def maybe_start(self, session) -> None:
        """Start a challenger for the next option worth one once the gate can judge it
        (enough held-out blocks) and ``session``'s solver has finite values: at once, fitted
        beside the solver, every option from the config's values. A structure is the first
        thing to get right: values fitted in the wrong one are biased (measured on the zoo's
        implicitfast robots, `bench/online.py`), and 60 s of data leave no time to wait for
        the solver first. Values fitted without the option carry its compensations, and a
        challenger started there kept them (measured: `noisy_mocap`'s soft-contact damping
        ratio at its bound of 20; slow_winch's solver at 6x the true damping and 0.27x its
        time constant led the winch speed to 0.02 m/s, true 0.25, predicting worse than the
        base; from the config's values it found 0.29 m/s and predicted 2x better)."""
        main = session.trainer
        if main is None or not session.can_judge or self.urgent:
            return
        learnt = getattr(main, "learn", ())
        split = tuple(getattr(getattr(main, "config", None), "per_element", ()))
        windows_from = windows_origin(self.adopted, main, session.config)
        pinned = self.pins(main)
        converged = bool(getattr(main, "done", False)) and bool(getattr(getattr(main, "schedule", None),
                                                                       "converged", False))
        values = main.parameters.as_dict()
        width = getattr(getattr(main, "config", None), "pose_window", session.config.pose_window)   # the solver's
        option = self.next_option(session.heldout_total, session.robot, session.floor, learnt, split,
                                  session.fixed_rods, windows_from, pinned, converged,
                                  lags_outlast_windows(values, width * session.config.period))
        urgent = option is not None and option in self.pin_options(pinned)
        if self.active and not urgent:
            return
        if option is None or not healthy_values(values):
            return
        if self.active:                         # set aside, not refused: it is tried again later
            session.log(f"structure: {self.option} set aside for {option} (a value pinned at a bound)")
            self.challenger, self.option, self.base_values = None, None, None
        config = session.config
        robot = structure_robot(session.robot, (option,))
        # the challenger steps with its robot's integrator once that is not the config's (the
        # config's fine_integrator would override it), else as the session's solver does
        own_step = ONLINE_OPTIONS[option].integrator or robot.integrator != session.config_robot.integrator
        # the solver's split, windows' length and start (an adopted fresh start's) carry over
        cfg = dataclasses.replace(config, per_element=split, init="given",
                                  pose_window=width,
                                  windows_from=windows_from or config.windows_from,
                                  fine_integrator=None if own_step else config.fine_integrator,
                                  fd_max_iters=CHALLENGER_FD_ITERS,
                                  max_epochs=min(config.max_epochs, CHALLENGER_MAX_EPOCHS),
                                  max_seconds=min(config.max_seconds or math.inf, CHALLENGER_MAX_SECONDS))
        cfg = self.config_with(cfg, learnt, (option,))
        start = ONLINE_OPTIONS[option].start
        start_values = swapped_lags(values) if start == "swapped_lags" else dict(values) if start == "solver" else {}
        if start_values is None:                # nothing to exchange now: tried again on more data
            session.log(f"structure: {option} not tried: the motor's and the cables' lags are alike "
                        "or cannot be exchanged")
            self._end(option, "nothing to exchange", session.heldout_total)
            return
        try:
            start = PhysicalParameters(robot, start_values or None, per_element=split)
            trainer = session.trainer_factory(robot, cfg, session.device, start, session.log)
            trainer.set_data(session.window_tuples())
        except Exception as exc:  # noqa: BLE001 - an option this model cannot be fitted in is refused,
            # not raised into the session's step (a schedule of implicit steps and the soft law's ground)
            session.log(f"structure: {option} refused: failed to start ({exc})")
            self._end(option, f"failed to start ({exc})", session.heldout_total)
            return
        self.challenger, self.option, self.base_values = trainer, option, values
        self.challenger_epochs = self.trailing = 0
        self.challenger_seconds = self.solver_seconds = 0.0
        self.urgent = urgent
        session.log(f"structure: fitting {option} on top of {'+'.join(self.adopted) or 'the base'}"
                    + (f" ({', '.join(f'{n} at its {side} bound' for n, side in pinned)})"
                       if urgent else ""))

    def solver_took(self, seconds: float) -> None:
        """The solver's epoch took ``seconds`` of the worker's compute (`challengers_turn`)."""
        if self.active:
            self.solver_seconds += seconds

    def step(self, session) -> Optional[tuple[dict, dict]]:
        """`_epoch`, its compute (``session.compute_clock``) counted toward the running
        challenger's share (`challengers_turn`)."""
        challenger, epoch = self.challenger, TimedCall()
        try:
            with session.work.timed(session.compute_clock, "challengers") as epoch:
                return self._epoch(session)
        finally:                                           # the call has returned: its seconds are in
            if self.challenger is challenger:          # not a new one's
                self.challenger_seconds += epoch.seconds

    def _epoch(self, session) -> Optional[tuple[dict, dict]]:
        """One epoch of the challenger; at its end, and every `JUDGE_EVERY` of its epochs,
        the verdict: adopted (``session.adopt``) only if the gate passes it at the stricter
        test *and* it beats, by the same test, the session's fit as it stands now (the
        option, not more solver time, must have earned it: the solver trains on beside it).
        Its end, a divergence, a failure or `FUTILE_LOOKS` trailing looks in a row refuse it.
        Returns (metrics, values) of one adopted before its end, for the caller to gate and
        publish now (waiting for the adopted trainer's next epoch on the grown window cost a
        run its last seconds: noisy_mocap seed 0, adopted at 55.9 s of 60), else None (one
        adopted at its end is taken like the solver's end: `finished`, then `finish`)."""
        challenger, option = self.challenger, self.option
        interim = False
        try:
            m = challenger.train_epoch()
            self.challenger_epochs += 1
            solvers_windows(challenger, session.trainer)      # its windows begin at its next epoch
            values = challenger.parameters.as_dict()
            if m.get("diverged") or not math.isfinite(float(m.get("val_loss", math.nan))) or not healthy_values(values):
                raise FloatingPointError("diverged")
            interim = not challenger.done
            if interim and self.challenger_epochs % (URGENT_JUDGE_EVERY if self.urgent else JUDGE_EVERY):
                return None
            reason = self._verdict(session, values, challenger)
        except Exception as exc:  # noqa: BLE001 - a failed challenger must not stop identification
            reason, interim = f"failed ({exc})", False
        adopted = reason == "better"
        if interim and not adopted:
            if not _trails(reason):
                self.trailing = 0
            elif not session.converged and not self.urgent:   # only one that takes the solver's epochs
                self.trailing += 1                                # for nothing is futile
            session.log(f"structure: {option} after {self.challenger_epochs} epochs: {reason}")
            if self.trailing < FUTILE_LOOKS:
                return None
            reason = f"futile: trailed at {self.trailing} looks in a row ({reason})"
        if adopted:
            try:
                session.adopt(challenger, float(m["val_loss"]))
            except Exception as exc:  # noqa: BLE001 - the session keeps its own trainer and structure
                adopted, reason = False, f"failed to take the window ({exc})"
        session.log(f"structure: {option} {'adopted' if adopted else 'refused: ' + reason}"
                    + (f" after {self.challenger_epochs} epochs, before its end" if interim else ""))
        self._end(option, "adopted" if adopted else reason, session.heldout_total)
        if adopted:
            return (m, values) if interim else None
        self.maybe_start(session)
        return None

    def _verdict(self, session, values: dict, challenger) -> str:
        """"better" when the challenger's ``values`` pass the gate and beat the session's fit
        as it stands now, both at the structure test (a start option: `_start_verdict`);
        else why not."""
        current = session.trainer.parameters.as_dict()
        base = current if healthy_values(current) else self.base_values
        option = ONLINE_OPTIONS[self.option]
        if option.windows_from is not None and option.window_factor == 1:
            return self._start_verdict(session, values, base)
        # longer windows' objective is not the solver's: the held-out blocks (1 s chains) judge
        significance, min_gain = ((PIN_SIGNIFICANCE, 0.0) if self.urgent
                                  else (STRUCTURE_SIGNIFICANCE, STRUCTURE_MIN_GAIN))
        verdict = session.gate(values, significance=significance, min_gain=min_gain, run=challenger)
        if not verdict.accepted:
            return verdict.reason
        reason = session.compare_on_heldout(values, base, significance, min_gain, run=challenger)
        return reason if reason == "better" else f"{_NOT_BETTER} ({reason})"

    @staticmethod
    def _start_verdict(session, values: dict, base: dict) -> str:
        """A start option's verdict: the same model fitted to the same data from elsewhere, so
        the lower minimum of the solver's own objective wins, both scored on the session's
        training windows as they are now (`acceptance.window_fit`, `START_WINDOWS` of them:
        ~4x the held-out tuples, no values added to pay for), by `START_MIN_GAIN`; and its held-out mean loss must be
        no higher than the session fit's (`online._compare`'s "worse"), lest it fit the
        training data's quirks. The gate then judges what it publishes as any fit."""
        width = session.trainer.config.pose_window
        fits = [window_fit(session.trainer, v, width, max_windows=START_WINDOWS) for v in (values, base)]
        if not all(f.size for f in fits):
            return "no training windows to compare on"
        fit, fit_base = (float(f.sum()) for f in fits)
        if not fit < (1.0 - START_MIN_GAIN) * fit_base:
            return f"{_NOT_BETTER} (worse: training windows {fit:.4g} against {fit_base:.4g})"
        reason = session.compare_on_heldout(values, base, significance=0.0, min_gain=0.0)
        return "better" if reason != "worse" else f"{_NOT_BETTER} (worse: a higher held-out loss)"

    def _end(self, option: str, verdict: str, heldout_total: int) -> None:
        self.challenger, self.option, self.base_values = None, None, None
        self.urgent = False
        self.log.append((option, verdict))
        if verdict == "adopted":
            self.pin_streak = {}                # the new solver's pins are its own
            self.adopted.append(option)
            # a refusal was a verdict against the old structure: options interact (kitchen_sink's
            # RK4 step with shared cable values predicted worse than the base and was refused;
            # its cables need both), so each refused one is tried again on the new one at once
            self.refused.clear()
        else:                                  # tried again on twice the held-out data
            self.refused[option] = max(int(heldout_total), 1)

    def state(self) -> dict:
        return {"adopted": list(self.adopted), "refused": dict(self.refused)}

    def restore(self, data: Optional[dict]) -> None:
        self.reset()
        if not data:
            return
        allowed = set(self.options) | (set(PIN_OPTIONS.values()) | set(EARLIER_PIN_OPTIONS) if self.follow_pins
                                       else set())
        self.adopted = [n for n in online_options(data.get("adopted", ())) if n in allowed]   # a pin's too
        self.refused = {str(k): int(v) for k, v in dict(data.get("refused", {})).items()
                        if k in allowed and math.isfinite(float(v))}
