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

import numpy as np

from tensegrity_engine.identification.online_structure import structure_key
from tensegrity_engine.physics.config import RobotConfig

__all__ = ["StructuredScores"]


class StructuredScores:
    """The session's scorers per structure and the scores of its reference models."""

    def __init__(self):
        self.reset()

    def reset(self) -> None:
        self.scorers: dict = {}        # structure key -> a trainer that scores in it
        self.references: dict = {}     # (data version, scale, structure, values) -> per-block scores

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
    def scores(session, run, data, values: dict):
        """``run``'s held-out (loss, CoM error) per block of ``values``, the loss on the
        session trainer's scale."""
        objective, own = getattr(run, "objective", None), getattr(session.trainer, "objective", None)
        shared = objective is not None and own is not None and objective is not own
        scale = getattr(objective, "loss_scale", None)
        if shared:
            objective.loss_scale = own.loss_scale
        try:
            return run.heldout_loss(data, values, chain=session.holdout_block, per_block=True)
        finally:
            if shared:
                objective.loss_scale = scale

    def reference(self, session, data, values: dict, robot: RobotConfig) -> tuple[np.ndarray, np.ndarray]:
        """Held-out (loss, CoM error) per block of a model the gate compares with, in its
        structure ``robot``; recomputed only when the held-out data, the loss scale or the
        model changes."""
        scale = getattr(getattr(session.trainer, "objective", None), "loss_scale", None)
        key = (session.heldout_len, int(session.heldout[-1].t0[-1]), scale, structure_key(robot),
               repr(sorted((k, list(map(float, np.ravel(v)))) for k, v in values.items())))
        if key not in self.references:
            fresh = {k: v for k, v in self.references.items() if k[:3] == key[:3]}
            fresh[key] = self.scores(session, self.scorer(session, robot), data, values)
            self.references = fresh
        return self.references[key]
