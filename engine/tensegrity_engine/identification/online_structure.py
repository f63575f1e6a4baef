"""Structure options tried while the robot works (`OnlineIdentification`'s challengers).

Offline, `structure.select_structure` fits every option on hanging data. Online there is
only what the robot does on the floor, and no time to fit every option at once. Here, each
time the session's solver has converged on the data so far, one option is fitted on top
of the current structure by a *challenger*: a second trainer on the same data, started
from the current values, with the option's values learnt as well, run in the time the
session would otherwise wait for new tuples. When its schedule ends, the challenger is
judged on the held-out blocks by the session's gate with a stricter test than a candidate
of the same structure (more parameters must pay for themselves: a lower held-out loss by
``significance`` standard errors of the per-block difference *and* by ``min_gain`` of the
loss, no larger CoM error, better than the config). Adopted, it becomes the session's
trainer (its values are published with the others and learnt from then on); refused, the
option waits until the held-out data has doubled (more evidence) before it is tried again.

Only options that add *values* can be tried online: the parameter message carries them.
An integrator or a per-element split changes how the planner must build the model and is
chosen offline (`tensegrity-identify identify --structure`).
"""
from __future__ import annotations

import dataclasses
import math
from typing import Optional, Sequence

from tensegrity_engine.identification.config import IdentificationConfig
from tensegrity_engine.physics.params import PhysicalParameters

__all__ = ["ONLINE_OPTIONS", "online_options", "StructureTrials", "STRUCTURE_SIGNIFICANCE", "STRUCTURE_MIN_GAIN"]

# option -> the values it adds (`structure.OPTIONS`, the value-only ones)
ONLINE_OPTIONS = {
    "end_heavy": ("rod_inertia_factor",),
    "slack_damping": ("cable_slack_damping",),
    "winch_speed": ("actuator_max_speed",),
}
# As offline selection (`select_structure`: 2 standard errors, 5 % gain).
STRUCTURE_SIGNIFICANCE = 2.0
STRUCTURE_MIN_GAIN = 0.05


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
        self.refused: dict[str, int] = {}     # option -> held-out tuples when it was refused
        self.challenger = None                 # the running challenger trainer
        self.option: Optional[str] = None      # the option it tries
        self.log: list[tuple[str, str]] = []   # (option, verdict) in the order they were judged

    @property
    def active(self) -> bool:
        return self.challenger is not None

    def next_option(self, heldout_len: int) -> Optional[str]:
        """The next option worth a challenger: neither adopted nor running, and not refused
        on at least half of today's held-out data."""
        for name in self.options:
            if name in self.adopted or name == self.option:
                continue
            if name in self.refused and heldout_len < 2 * self.refused[name]:
                continue
            return name
        return None

    @staticmethod
    def learn_with(learn: Sequence[str], names: Sequence[str]) -> tuple[str, ...]:
        out = list(learn)
        for name in names:
            out += [n for n in ONLINE_OPTIONS[name] if n not in out]
        return tuple(out)

    def start(self, option: str, trainer_factory, robot, config: IdentificationConfig, device, values: dict,
              learn: Sequence[str], data, log) -> None:
        """A challenger for ``option``: ``learn`` plus its values, from ``values``, on ``data``."""
        cfg = dataclasses.replace(config, learn=self.learn_with(learn, (option,)), init="given")
        trainer = trainer_factory(robot, cfg, device, PhysicalParameters(robot, values), log)
        trainer.set_data(data)
        self.challenger, self.option = trainer, option

    def feed(self, data, *, replace: bool) -> None:
        """New tuples for the challenger (``replace``: the whole window changed)."""
        if self.challenger is None:
            return
        if replace:
            self.challenger.set_data(data)
        else:
            self.challenger.add_tuples(data)

    def judged(self, accepted: bool, reason: str, heldout_len: int):
        """End the challenger with the gate's verdict; returns it if adopted, else None."""
        trainer, option = self.challenger, self.option
        self.challenger, self.option = None, None
        self.log.append((option, "adopted" if accepted else reason))
        if accepted:
            self.adopted.append(option)
            self.refused.pop(option, None)
            return trainer
        self.refused[option] = max(int(heldout_len), 1)
        return None

    def drop(self, why: str) -> None:
        """Abandon the running challenger (it diverged): the option counts as refused now."""
        if self.challenger is not None:
            self.log.append((self.option, why))
            self.refused[self.option] = 1
        self.challenger, self.option = None, None

    def state(self) -> dict:
        return {"adopted": list(self.adopted), "refused": dict(self.refused)}

    def restore(self, data: Optional[dict]) -> None:
        self.reset()
        if not data:
            return
        self.adopted = [n for n in online_options(data.get("adopted", ())) if n in self.options]
        self.refused = {str(k): int(v) for k, v in dict(data.get("refused", {})).items()
                        if k in self.options and math.isfinite(float(v))}
