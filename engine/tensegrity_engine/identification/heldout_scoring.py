"""Held-out scores of models fitted in different structures (`OnlineIdentification`'s gate).

A model is a set of values *and* the structure they were fitted in (integrator, soft-law
contact dimensionality: `online_structure.structure_key`). The gate compares a candidate
with the published model and with the config, which may be of other structures once a
structure challenger was adopted; each is rolled out in its own. A trainer built in a
structure scores models in it: the session's, its challenger's, one the session replaced
(kept), or a new one on the training window. All losses are put on the session trainer's
scale: each trainer normalises by the motion of the first data it saw.
"""
from __future__ import annotations

import dataclasses
from typing import Optional

import numpy as np

from tensegrity_engine.identification.online_structure import structure_key
from tensegrity_engine.physics.config import RobotConfig

__all__ = ["StructuredScores"]

# reference models whose block scores are kept: the published one and the config (and the
# ones they replace, while a structure challenger is judged)
KEPT_REFERENCES = 6
# candidates whose block scores are kept: the one published last, met as the incumbent
# after the next candidate was scored
KEPT_CANDIDATES = 2


class StructuredScores:
    """The session's scorers per structure and the scores of its reference models."""

    def __init__(self):
        self.reset()

    def reset(self) -> None:
        self.scorers: dict = {}        # structure key -> a trainer that scores in it
        # (scale, structure, values) -> (held-out data version, {block key: (loss, CoM
        # error)}, the scores on that version), newest last
        self.references: dict = {}
        # key -> entry of the last candidates (the newest last): the next incumbent is one
        self.judged: dict = {}

    def keep(self, trainer) -> None:
        """``trainer`` (replaced by a challenger of another structure) scores its own."""
        self.scorers[structure_key(trainer.robot)] = trainer

    def scorer(self, session, robot: RobotConfig):
        """A trainer that scores models in ``robot``'s structure."""
        key = structure_key(robot)
        for run in (session.trainer, session.trials.challenger, self.scorers.get(key)):
            if run is not None and structure_key(getattr(run, "robot", session.robot)) == key:
                return run
        config = dataclasses.replace(session.config, init="given", fine_integrator=None)
        run = session.trainer_factory(robot, config, session.device, None, session.log)
        run.set_data(session.window_tuples())
        self.scorers[key] = run
        return run

    @staticmethod
    def scores(session, run, data, values: dict, known: Optional[dict] = None):
        """``run``'s held-out (loss, CoM error) per block of ``values``, the loss on the
        session trainer's scale; ``known``: `acceptance.heldout_scores`'."""
        objective, own = getattr(run, "objective", None), getattr(session.trainer, "objective", None)
        shared = objective is not None and own is not None and objective is not own
        scale = getattr(objective, "loss_scale", None)
        if shared:
            objective.loss_scale = own.loss_scale
        try:
            return run.heldout_loss(data, values, chain=session.holdout_block, per_block=True, known=known)
        finally:
            if shared:
                objective.loss_scale = scale

    @staticmethod
    def _key(session, values: dict, robot: RobotConfig) -> tuple:
        scale = getattr(getattr(session.trainer, "objective", None), "loss_scale", None)
        return (scale, structure_key(robot), repr(sorted((k, list(map(float, np.ravel(v)))) for k, v in values.items())))

    @staticmethod
    def _version(session) -> tuple:
        """What the held-out tuples depend on: the blocks, and the window whose commands
        start their actuator states (`OnlineIdentification.heldout_tuples`: a window that
        slid leaves the oldest blocks other starts)."""
        start = int(session.window[0].t0.min()) if session.window else None
        return session.heldout_len, int(session.heldout[-1].t0[-1]), start

    def candidate(self, session, run, data, values: dict) -> tuple[np.ndarray, np.ndarray]:
        """`scores` of a candidate the gate judges, kept: if it is published, these are the
        next gate's reference scores."""
        known: dict = {}
        scored = self.scores(session, run, data, values, known)
        key = self._key(session, values, getattr(run, "robot", session.robot))
        self.judged.pop(key, None)
        self.judged[key] = (self._version(session), known, scored)
        while len(self.judged) > KEPT_CANDIDATES:        # the gate meets the new one first
            self.judged.pop(next(iter(self.judged)))
        return scored

    def reference(self, session, data, values: dict, robot: RobotConfig) -> tuple[np.ndarray, np.ndarray]:
        """Held-out (loss, CoM error) per block of a model the gate compares with, in its
        structure ``robot``. Each block is rolled out once per model (a published model's
        were, when the gate judged it): the gate meets the published model and the config
        at every look, on blocks that mostly did not change (re-scoring all of them took 8.3 s
        of the worker's 60 on the SUPERball soft_slow robot, 1.5 s now)."""
        key = self._key(session, values, robot)
        entry = self.references.pop(key, None) or self.judged.get(key)
        seen, known, scored = entry or (None, {}, None)
        version = self._version(session)
        if seen != version:                              # new blocks: only they are rolled out
            scored = self.scores(session, self.scorer(session, robot), data, values, known)
        self.references[key] = (version, known, scored)     # the newest last
        while len(self.references) > KEPT_REFERENCES:
            self.references.pop(next(iter(self.references)))
        return scored
