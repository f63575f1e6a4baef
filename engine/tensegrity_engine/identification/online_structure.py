"""Structure options tried while the robot works (`OnlineIdentification`'s challengers).

Offline, `structure.select_structure` fits every option on hanging data. Online there is
only what the robot does on the floor, and no time to fit every option at once. Here, each
time the session's solver has converged on the data so far, one option is fitted on top
of the current structure by a *challenger*: a second trainer on the same data, started
from the current values, with the option's values learnt as well, run in the time the
session would otherwise wait for new tuples. When its schedule ends, the challenger is
judged on the held-out blocks by the session's gate with a stricter test than a candidate
of the same structure (more parameters must pay for themselves: a lower held-out loss by
``STRUCTURE_SIGNIFICANCE`` standard errors of the per-block difference *and* by
``STRUCTURE_MIN_GAIN`` of the loss, no larger CoM error, better than the published model,
the config, and the base fit it started from). Adopted, it becomes the session's trainer
and ends like the solver (the caller's gate and convergence test, then publication); its
values are learnt from then on. Refused, failed or over its own budget, the option waits
until twice the held-out tuples have been seen before it is tried again.

Only options that add *values* can be tried online: the parameter message carries them.
An integrator or a per-element split changes how the planner must build the model and is
chosen offline (`tensegrity-identify identify --structure`).
"""
from __future__ import annotations

import dataclasses
import math
from typing import Optional, Sequence

import numpy as np

from tensegrity_engine.identification.config import IdentificationConfig
from tensegrity_engine.physics.params import PhysicalParameters

__all__ = ["ONLINE_OPTIONS", "online_options", "StructureTrials", "healthy_values", "STRUCTURE_SIGNIFICANCE",
           "STRUCTURE_MIN_GAIN"]

# option -> the values it adds (`structure.OPTIONS`, the value-only ones)
ONLINE_OPTIONS = {
    "end_heavy": ("rod_inertia_factor",),
    "slack_damping": ("cable_slack_damping",),
    "winch_speed": ("actuator_max_speed",),
}
# As offline selection (`select_structure`: 2 standard errors, 5 % gain).
STRUCTURE_SIGNIFICANCE = 2.0
STRUCTURE_MIN_GAIN = 0.05
# A challenger's own budget: one that never passes its convergence test (a winch limit the
# robot never reaches: a flat direction) must not hold the other options back for good.
CHALLENGER_MAX_EPOCHS = 60
CHALLENGER_MAX_SECONDS = 120.0


def healthy_values(values: dict) -> bool:
    """Every value finite (`OnlineIdentification` and its challengers)."""
    return all(np.isfinite(np.asarray(v, dtype=np.float64)).all() for v in values.values())


def online_options(names: Sequence[str]) -> tuple[str, ...]:
    """``names`` checked: known, value-only options, each once (ValueError otherwise)."""
    out = []
    for name in names:
        if name not in ONLINE_OPTIONS:
            raise ValueError(f"structure option {name!r} cannot be tried online; online options: "
                             f"{', '.join(ONLINE_OPTIONS)} (integrators and per-element splits: "
                             "tensegrity-identify identify --structure, offline)")
        if name not in out:
            out.append(name)
    return tuple(out)


class StructureTrials:
    """Which options are adopted, refused (and on how much held-out data), and the running
    challenger. The session owns the data and the gate; this owns the bookkeeping."""

    def __init__(self, options: Sequence[str] = ()):
        self.options = online_options(options)
        self.reset()

    def reset(self) -> None:
        self.adopted: list[str] = []
        self.refused: dict[str, int] = {}     # option -> held-out tuples (ever) when it was refused
        self.challenger = None                 # the running challenger trainer
        self.option: Optional[str] = None      # the option it tries
        self.base_values: Optional[dict] = None   # the values it started from (the base fit)
        self.log: list[tuple[str, str]] = []   # (option, verdict) in the order they were judged

    @property
    def active(self) -> bool:
        return self.challenger is not None

    def next_option(self, heldout_total: int) -> Optional[str]:
        """The next option worth a challenger: neither adopted nor running, and, if refused
        (or failed), refused on at most half of the held-out tuples seen since the start."""
        for name in self.options:
            if name in self.adopted or name == self.option:
                continue
            if name in self.refused and heldout_total < 2 * self.refused[name]:
                continue
            return name
        return None

    @staticmethod
    def learn_with(learn: Sequence[str], names: Sequence[str]) -> tuple[str, ...]:
        out = list(learn)
        for name in names:
            out += [n for n in ONLINE_OPTIONS[name] if n not in out]
        return tuple(out)

    def maybe_start(self, session) -> None:
        """Start a challenger for the next option worth one while ``session``'s solver waits
        for new data (done, its values finite, enough held-out blocks for the gate)."""
        main = session.trainer
        if self.active or main is None or not main.done or not session.can_judge:
            return
        option = self.next_option(session.heldout_total)
        values = main.parameters.as_dict() if option is not None else {}
        if option is None or not healthy_values(values):
            return
        config = session.config
        cfg = dataclasses.replace(config, learn=self.learn_with(main.learn, (option,)), init="given",
                                  max_epochs=min(config.max_epochs, CHALLENGER_MAX_EPOCHS),
                                  max_seconds=min(config.max_seconds or math.inf, CHALLENGER_MAX_SECONDS))
        trainer = session.trainer_factory(session.robot, cfg, session.device,
                                          PhysicalParameters(session.robot, values), session.log)
        trainer.set_data(session.window_tuples())
        self.challenger, self.option, self.base_values = trainer, option, values
        session.log(f"structure: fitting {option} on top of {'+'.join(self.adopted) or 'the base'}")

    def feed(self, data, *, replace: bool) -> None:
        """New tuples for the challenger (``replace``: the whole window changed)."""
        if self.challenger is None:
            return
        if replace:
            self.challenger.set_data(data)
        else:
            self.challenger.add_tuples(data)

    def step(self, session) -> None:
        """One epoch of the challenger; at its end the verdict: adopted (``session.adopt``)
        only if the gate passes it at the stricter test *and* it beats, by the same test, the
        base fit it started from (the option, not more solver time, must have earned it)."""
        challenger, option = self.challenger, self.option
        try:
            m = challenger.train_epoch()
            values = challenger.parameters.as_dict()
            if m.get("diverged") or not math.isfinite(float(m.get("val_loss", math.nan))) or not healthy_values(values):
                raise FloatingPointError("diverged")
            if not challenger.done:
                return
            verdict = session.gate(values, significance=STRUCTURE_SIGNIFICANCE, min_gain=STRUCTURE_MIN_GAIN)
            reason = verdict.reason
            if verdict.accepted:
                reason = session.compare_on_heldout(values, self.base_values, STRUCTURE_SIGNIFICANCE,
                                                    STRUCTURE_MIN_GAIN)
                if reason != "better":
                    reason = f"no better than the base fit ({reason})"
        except Exception as exc:  # noqa: BLE001 - a failed challenger must not stop identification
            reason = f"failed ({exc})"
        adopted = reason == "better"
        self._end(option, "adopted" if adopted else reason, session.heldout_total)
        session.log(f"structure: {option} {'adopted' if adopted else 'refused: ' + reason}")
        if adopted:
            session.adopt(challenger, float(m["val_loss"]))
        else:
            self.maybe_start(session)

    def _end(self, option: str, verdict: str, heldout_total: int) -> None:
        self.challenger, self.option, self.base_values = None, None, None
        self.log.append((option, verdict))
        if verdict == "adopted":
            self.adopted.append(option)
            self.refused.pop(option, None)
        else:                                  # tried again on twice the held-out data
            self.refused[option] = max(int(heldout_total), 1)

    def state(self) -> dict:
        return {"adopted": list(self.adopted), "refused": dict(self.refused)}

    def restore(self, data: Optional[dict]) -> None:
        self.reset()
        if not data:
            return
        self.adopted = [n for n in online_options(data.get("adopted", ())) if n in self.options]
        self.refused = {str(k): int(v) for k, v in dict(data.get("refused", {})).items()
                        if k in self.options and math.isfinite(float(v))}
